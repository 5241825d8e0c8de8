() => {
  // Escape stops the running answer or ingestion, as the Stop button does.
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    const stop = document.querySelector("#stop-button");
    if (stop) stop.click();
  });
  document.title = "LM-Infinite chat";
}
