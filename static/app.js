() => {
  // Escape stops the running answer or ingestion, as the Stop button does: from the page or the chat box, not
  // from a field or list that Escape closes or leaves (a dropdown, a setting, a name being typed).
  const escapeBelongsTo = (target) => target instanceof Element &&
    target.closest("input, select, [role=listbox], [role=combobox], [role=dialog]") !== null;
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape" || event.defaultPrevented || escapeBelongsTo(event.target)) return;
    const stop = document.querySelector("#stop-button");
    if (stop) stop.click();
  });

  // Files dropped on the chat are attached exactly as files dropped on the chat box are: the drop is handed
  // to the chat box's drop zone (the chat says "drop files here"; on its own it would ignore the drop, or
  // the browser would open the file).
  const overChat = (event) => event.target instanceof Element && event.target.closest("#chat");
  const withFiles = (event) => event.dataTransfer && Array.from(event.dataTransfer.types || []).includes("Files");
  const highlight = (on) => document.querySelector("#chat")?.classList.toggle("drop-target", on);
  for (const type of ["dragenter", "dragover"]) {
    document.addEventListener(type, (event) => {
      if (!overChat(event) || !withFiles(event)) return;
      event.preventDefault();  // lets the drop happen here
      event.dataTransfer.dropEffect = "copy";
      highlight(true);
    });
  }
  document.addEventListener("dragleave", (event) => {
    if (overChat(event) && !(event.relatedTarget instanceof Element && event.relatedTarget.closest("#chat"))) {
      highlight(false);
    }
  });
  document.addEventListener("drop", (event) => {
    highlight(false);
    if (!overChat(event) || !withFiles(event)) return;
    event.preventDefault();
    const zone = document.querySelector("#chat-input .full-container");
    if (!zone) return;
    const files = new DataTransfer();
    for (const file of event.dataTransfer.files) files.items.add(file);
    for (const type of ["dragenter", "dragover", "drop"]) {
      zone.dispatchEvent(new DragEvent(type, {bubbles: true, cancelable: true, dataTransfer: files}));
    }
  });
  // Leaving saves the workspace, but stops work in progress (reading, feeding, answering): ask first.
  // Stop is enabled exactly while this tab's workspace has work running or queued.
  window.addEventListener("beforeunload", (event) => {
    const stop = document.querySelector("#stop-button");
    if (stop && !stop.disabled) {
      event.preventDefault();
      event.returnValue = "";
    }
  });
  // What two buttons do that their names do not say: set as tooltips, again whenever Gradio redraws them.
  const tips = {
    "regenerate-button": "Answer the last question again, in its place (a stopped answer too).",
    "new-context-button": "Start a new, empty workspace: this one is saved and stays in Workspaces.",
  };
  const setTips = () => {
    for (const [id, tip] of Object.entries(tips)) {
      const button = document.getElementById(id);
      if (button && button.title !== tip) button.title = tip;
    }
  };
  setTips();
  new MutationObserver(setTips).observe(document.body, {childList: true, subtree: true});
  document.title = "LM-Infinite chat";
}
