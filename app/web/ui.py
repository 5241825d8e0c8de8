"""The layout: what is on screen. No behaviour here (see events.py and handlers.py)."""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from .views import DOCUMENT_COLUMN_WIDTHS, DOCUMENT_HEADERS
from .workspace_views import WORKSPACE_COLUMN_WIDTHS, WORKSPACE_HEADERS

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"
# The outputs of every work event (Handlers.view returns their values in this order).
VIEW = ("chatbot", "documents", "context", "activity", "stop_note", "export_files", "stop", "cancel", "answer_from")
ACCEPTED_TYPES = [  # a hint for the file picker: ingest decides what it reads, and says why it skips the rest
    ".pdf", ".zip", ".tar", ".tgz", ".gz", ".bz2", ".xz", ".tbz2", ".txz", ".txt", ".md", ".rst", ".ipynb", ".html",
    ".htm", ".xhtml", ".xml", ".json", ".yaml", ".yml", ".toml", ".ini", ".cfg", ".conf", ".csv", ".py", ".js",
    ".mjs", ".cjs", ".ts", ".tsx", ".jsx", ".vue", ".svelte", ".java", ".kt", ".kts", ".scala", ".groovy",
    ".gradle", ".c", ".h", ".cpp", ".cc", ".cxx", ".hpp", ".hh", ".cs", ".fs", ".m", ".mm", ".swift", ".go", ".rs",
    ".rb", ".php", ".pl", ".pm", ".lua", ".r", ".jl", ".dart", ".ex", ".exs", ".erl", ".hs", ".ml", ".clj", ".sql",
    ".proto", ".tf", ".sh", ".bat", ".ps1", ".cmake", ".mk", ".css", "text"]


@dataclass(frozen=True)
class LayoutInfo:
    """What the layout shows that depends on the server's configuration."""

    notice: str
    share_warning: bool
    allow_local_paths: bool
    budget_tokens: int
    max_file_size: str
    system_prompt: str
    temperature: float
    top_p: float
    max_new_tokens: int
    repetition_penalty: float
    recall: bool
    topk: int
    quote: bool
    window: int
    n_starting: int
    browser_secret: str  # encrypts the workspace id the browser keeps; the same across server restarts
    models: tuple[tuple[str, str], ...] = ()  # the installed bundled models, (label, short name): Settings → Model
    model: str | None = None  # the running model's short name, when it is a bundled one
    model_switch: bool = True  # whether Settings may switch it (--no-model-switch)
    guess: bool = True  # search with a passage the model writes first (--no-guess; app/engine/guess.py)


@dataclass
class Components:
    chatbot: gr.Chatbot
    chat_input: gr.MultimodalTextbox
    stop: gr.Button
    regenerate: gr.Button
    clear: gr.Button
    new_context: gr.Button
    export: gr.Button
    export_files: gr.File
    stop_note: gr.Markdown
    upload: gr.File
    server_path: gr.Textbox | None
    add_path: gr.Button | None
    activity: gr.HTML
    cancel: gr.Button
    documents: gr.Dataframe
    remove_choice: gr.Dropdown
    remove: gr.Button
    answer_from: gr.CheckboxGroup
    context: gr.HTML
    panel: gr.HTML
    panel_data: gr.JSON
    memory_plot: gr.LinePlot
    throughput_plot: gr.LinePlot  # prefill
    decode_plot: gr.LinePlot
    system_prompt: gr.Textbox
    temperature: gr.Slider
    top_p: gr.Slider
    max_new_tokens: gr.Slider
    repetition_penalty: gr.Slider
    recall: gr.Checkbox
    topk: gr.Slider
    quote: gr.Checkbox
    guess: gr.Checkbox
    timer: gr.Timer
    ask_question: gr.Textbox  # the /ask API's inputs and output: in the layout, never shown
    ask_files: gr.File
    ask_result: gr.JSON
    ask_trigger: gr.Button
    show_trigger: gr.Button  # the /show API: the session as it is
    reset_trigger: gr.Button  # the /new_context API: an API client's session emptied in place (never saved)
    workspace_id: gr.BrowserState  # which workspace this browser shows: a reload reopens it
    workspace_name: gr.Textbox
    save: gr.Button
    workspace_note: gr.Markdown
    workspaces: gr.Dataframe
    workspace_choice: gr.Dropdown
    open_workspace: gr.Button
    new_workspace: gr.Button
    delete_workspace: gr.Button
    download_workspace: gr.Button
    workspace_file: gr.File  # the download
    import_file: gr.File
    model_choice: gr.Dropdown  # Settings → Model (model_switch.py)
    switch_model: gr.Button
    model_note: gr.Markdown
    restarting: gr.Checkbox  # never shown: tells the page to wait for the restart and reload

    @property
    def view(self) -> list:
        """Outputs of every work event, in Handlers.view's order."""
        return [getattr(self, name) for name in VIEW]

    @property
    def workspace_view(self) -> list:
        """Outputs of the Workspaces tab, in Handlers.workspace_view's order."""
        return [self.workspace_name, self.workspace_note, self.workspaces, self.workspace_choice]


def _icon(name: str) -> str:
    return str(STATIC_DIR / f"icon-{name}.svg")


def _recall_line(info: LayoutInfo) -> str:
    """How the server answers by default (the Settings tab can change it per session)."""
    if not info.recall:
        return "top-k middle recall off"
    if info.quote:
        return "top-k middle recall reads each question, and the top sources it finds are quoted before the answer"
    return "top-k middle recall while answering"


def header_html(info: LayoutInfo) -> str:
    logo = (STATIC_DIR / "logo.svg").read_text(encoding="utf-8")
    banner = ""
    if info.share_warning:
        banner = ('<div class="share-banner" role="alert">⚠️ This app is shared publicly without a login '
                  "(--share without --auth): anyone with the link can use this model. Do not upload private "
                  "documents.</div>")
    return (f'{banner}<div class="app-header">{logo}<div><h1>LM-Infinite chat</h1>'
            f'<p class="model-notice">{html.escape(info.notice)}</p>'
            f'<p class="model-notice">Attention: {info.n_starting} starting tokens + a {info.window:,}-token window, '
            f"{_recall_line(info)}. Context budget {info.budget_tokens:,} tokens per session; "
            f"uploads up to {html.escape(info.max_file_size)}.</p></div></div>")


def build_layout(info: LayoutInfo) -> tuple[gr.Blocks, Components]:
    with gr.Blocks(title="LM-Infinite chat", fill_width=True, delete_cache=(3600, 3600)) as demo:
        gr.HTML(header_html(info), elem_id="app-header")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=480):
                chatbot = gr.Chatbot(
                    label="Chat", show_label=False, elem_id="chat", height=560, layout="panel",
                    buttons=["copy", "copy_all"],
                    avatar_images=(str(STATIC_DIR / "user.svg"), str(STATIC_DIR / "assistant.svg")),
                    placeholder="Drop PDFs, code files or a zipped repository here or in the box below, "
                                "then ask about them. Answers cite the pages each question drew the model's recall to.",
                    feedback_options=None, editable="user",
                )
                chat_input = gr.MultimodalTextbox(
                    elem_id="chat-input", file_count="multiple", sources=["upload"], file_types=ACCEPTED_TYPES,
                    placeholder="Ask a question, or drop PDFs, text/code files and .zip repositories…",
                    show_label=False, autofocus=True, max_lines=8,
                )
                with gr.Row(elem_id="chat-actions"):
                    stop = gr.Button("Stop", variant="stop", elem_id="stop-button", size="sm", icon=_icon("stop"),
                                     interactive=False)  # Stop and Cancel are active only while there is work
                    regenerate = gr.Button("Regenerate", size="sm", icon=_icon("regenerate"),
                                           elem_id="regenerate-button")
                    clear = gr.Button("Clear chat", size="sm", icon=_icon("clear"))
                    new_context = gr.Button("New context", size="sm", icon=_icon("new"), elem_id="new-context-button")
                    export = gr.Button("Export", size="sm", icon=_icon("export"), elem_id="export-button")
                stop_note = gr.Markdown(elem_id="stop-note")
                export_files = gr.File(label="Export (Markdown and JSON)", visible=False, file_count="multiple",
                                       interactive=False, elem_id="export-files")
            with gr.Column(scale=2, min_width=380):
                panel = gr.HTML(elem_id="live-panel")
                with gr.Tab("Documents", elem_id="documents-tab"):
                    upload = gr.File(label="Add documents (PDF, text, code, .zip repository)", file_count="multiple",
                                     file_types=ACCEPTED_TYPES, elem_id="documents-upload", height=120)
                    server_path = add_path = None
                    if info.allow_local_paths:
                        with gr.Row():
                            server_path = gr.Textbox(label="Folder, file or git URL on the server", scale=4)
                            add_path = gr.Button("Add", scale=1)
                    with gr.Row(equal_height=True):
                        activity = gr.HTML(elem_id="activity")
                        cancel = gr.Button("Cancel", variant="stop", size="sm", scale=0, min_width=90,
                                           elem_id="cancel-button", interactive=False)
                    context = gr.HTML(elem_id="context-summary")
                    documents = gr.Dataframe(headers=DOCUMENT_HEADERS, value=[], interactive=False, wrap=True,
                                             column_widths=DOCUMENT_COLUMN_WIDTHS, elem_id="documents-table",
                                             label="Files")
                    with gr.Row(equal_height=False, elem_id="remove-row"):
                        remove_choice = gr.Dropdown(label="Remove a document", choices=[], scale=4,
                                                    elem_id="remove-choice",
                                                    info="The rest of the context is read again without it.")
                        remove = gr.Button("Remove", size="sm", scale=1, min_width=90, elem_id="remove-button")
                    answer_from = gr.CheckboxGroup(
                        label="Answer from", choices=[], value=[], elem_id="answer-from",
                        info="Switched off, a document stays in the context but is neither cited nor quoted to the "
                             "model: answers come from the others. Nothing is read again.")
                with gr.Tab("Live charts", elem_id="live-tab"):
                    memory_plot = gr.LinePlot(x="seconds", y="value", color="series", title="Memory (MB)",
                                              x_title="seconds", y_title="MB", height=200)
                    # Prefill and decode apart: on one scale, decode (tens of tokens/s) lay flat under prefill
                    # (hundreds).
                    throughput_plot = gr.LinePlot(x="seconds", y="value", color="series",
                                                  title="Reading (prefill, tokens/s)", x_title="seconds",
                                                  y_title="tokens/s", height=180)
                    decode_plot = gr.LinePlot(x="seconds", y="value", color="series",
                                              title="Answering (decode, tokens/s)", x_title="seconds",
                                              y_title="tokens/s", height=180)
                    panel_data = gr.JSON(label="Raw numbers", visible=False)  # for API clients (/panel), not shown
                with gr.Tab("Workspaces", elem_id="workspaces-tab"):
                    with gr.Row(equal_height=True):
                        workspace_name = gr.Textbox(label="This workspace", scale=4, elem_id="workspace-name",
                                                    info="Saved when you leave or reload the page, and with Save.")
                        save = gr.Button("Save", variant="primary", scale=1, min_width=90, elem_id="save-button")
                    workspace_note = gr.Markdown(elem_id="workspace-note")
                    workspaces = gr.Dataframe(headers=WORKSPACE_HEADERS, value=[], interactive=False, wrap=True,
                                              column_widths=WORKSPACE_COLUMN_WIDTHS, label="Saved workspaces",
                                              elem_id="workspaces-table")
                    workspace_choice = gr.Dropdown(label="Workspace", choices=[], elem_id="workspace-choice")
                    with gr.Row():
                        open_workspace = gr.Button("Open", size="sm", min_width=70, elem_id="open-workspace")
                        new_workspace = gr.Button("New", size="sm", min_width=70, elem_id="new-workspace")
                        download_workspace = gr.Button("Download", size="sm", min_width=70, elem_id="download-workspace")
                        delete_workspace = gr.Button("Delete", size="sm", min_width=70, variant="stop",
                                                     elem_id="delete-workspace")
                    workspace_file = gr.File(label="Workspace file", visible=False, interactive=False,
                                             elem_id="workspace-file")
                    import_file = gr.File(label="Import a workspace file (.lmiw) from a server running the same "
                                          "model", file_types=[".lmiw"], elem_id="import-workspace", height=90)
                with gr.Tab("Settings", elem_id="settings-tab"):
                    system_prompt = gr.Textbox(info.system_prompt, label="System prompt", lines=3,
                                               info="Used when a context starts (new context or first message).")
                    temperature = gr.Slider(0, 2, value=info.temperature, step=0.05, label="Temperature",
                                            info="0 = greedy (deterministic)")
                    top_p = gr.Slider(0.05, 1, value=info.top_p, step=0.05, label="Top-p")
                    max_new_tokens = gr.Slider(16, 4096, value=info.max_new_tokens, step=16, label="Max new tokens")
                    repetition_penalty = gr.Slider(1.0, 2.0, value=info.repetition_penalty, step=0.05,
                                                   label="Repetition penalty", info="applies to the answer's tokens")
                    recall = gr.Checkbox(value=info.recall, label="Top-k middle recall while answering",
                                         info="Lets the question (and the answer, unless it quotes its top source) "
                                              "attend to the most relevant tokens beyond the window; powers the "
                                              "cited sources.")
                    topk = gr.Slider(1, 64, value=max(1, info.topk), step=1, label="k (tokens recalled per head)")
                    quote = gr.Checkbox(value=info.quote, label="Quote the top source before answering",
                                        info="The passage the question's recall ranks first is put before the "
                                             "question, and the answer is drawn without recall: a small model "
                                             "answers about three times as often right.")
                    guess = gr.Checkbox(value=info.guess, label="Search with a guessed answer too",
                                        info="Before searching, the model writes what it expects the documents to "
                                             "say, and its words are searched for beside the question's: finds the "
                                             "page more often when you ask in your own words. A few seconds on a "
                                             "CPU.")
                    with gr.Group(elem_id="model-picker"):
                        model_choice = gr.Dropdown(
                            choices=list(info.models), value=info.model, label="Model",
                            info="The installed models. Switching restarts the server with the one chosen: every "
                                 "open workspace is saved first, and a context opens under the model that read it."
                            if info.model_switch else "Switching is off on this server (--no-model-switch).",
                            interactive=info.model_switch, elem_id="model-choice")
                        switch_model = gr.Button("Switch model", size="sm", elem_id="switch-model",
                                                 interactive=info.model_switch)
                    model_note = gr.Markdown("", elem_id="model-note")
                    restarting = gr.Checkbox(False, visible=False)
        timer = gr.Timer(1.0)
        workspace_id = gr.BrowserState(None, storage_key="lminfinite-chat-workspace", secret=info.browser_secret)
        with gr.Group(visible=False):
            ask_question = gr.Textbox(label="question")
            ask_files = gr.File(label="files", file_count="multiple")
            ask_result = gr.JSON(label="result")
            ask_trigger = gr.Button("ask")
            show_trigger = gr.Button("show")
            reset_trigger = gr.Button("new context")
    return demo, Components(
        chatbot=chatbot, chat_input=chat_input, stop=stop, regenerate=regenerate, clear=clear,
        new_context=new_context, export=export, export_files=export_files, stop_note=stop_note, upload=upload,
        server_path=server_path, add_path=add_path, activity=activity, cancel=cancel, documents=documents,
        remove_choice=remove_choice, remove=remove, answer_from=answer_from,
        context=context, panel=panel, panel_data=panel_data, memory_plot=memory_plot, throughput_plot=throughput_plot,
        decode_plot=decode_plot,
        system_prompt=system_prompt, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
        repetition_penalty=repetition_penalty, recall=recall, topk=topk, quote=quote, guess=guess, timer=timer,
        ask_question=ask_question,
        ask_files=ask_files, ask_result=ask_result, ask_trigger=ask_trigger, show_trigger=show_trigger,
        reset_trigger=reset_trigger, workspace_id=workspace_id,
        workspace_name=workspace_name, save=save, workspace_note=workspace_note, workspaces=workspaces,
        workspace_choice=workspace_choice, open_workspace=open_workspace, new_workspace=new_workspace,
        delete_workspace=delete_workspace, download_workspace=download_workspace, workspace_file=workspace_file,
        import_file=import_file, model_choice=model_choice, switch_model=switch_model, model_note=model_note,
        restarting=restarting,
    )
