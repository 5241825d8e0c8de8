"""Wiring: which handler runs on which event, on which queue.

Three kinds of events:
- fast bookkeeping (no limit): record the action, show it, set Stop flags, export, the panel timer;
- reading (concurrency id "read", one at a time): ingest parses files, never touching the model;
- model work (concurrency id "model"): prefill and decode. Sessions' model steps run side by side and
  take turns at the model through runtime.gate (model_gate.py), so a question waits behind one chunk of
  someone's document rather than behind the whole upload; the live panel shows the measured wait.
"""

from __future__ import annotations

import inspect

from .handlers import Handlers
from .model_switch import RELOAD_WHEN_BACK
from .ui import Components

FAST = {"concurrency_limit": None, "show_progress": "hidden"}
READ = {"concurrency_id": "read", "concurrency_limit": 1, "show_progress": "hidden"}
MODEL = {"concurrency_id": "model", "concurrency_limit": None}


def input_names(handler) -> list[str]:
    """A handler's value parameters: the layout has a component of the same name for each."""
    return [name for name in inspect.signature(handler).parameters if name not in ("self", "request")]


def wire(demo, c: Components, h: Handlers) -> None:
    view = c.view
    settings = [getattr(c, name) for name in input_names(h.run)]  # matched by name, not by position
    controls = [c.stop_note, c.stop, c.cancel]

    def then_model(event, api_name: str):
        """Chain the model step (and re-enable the chat box) after a fast or reading step."""
        # No Gradio overlay ("processing | 2.9s" over the panels, a "•••" bubble in the chat): the activity line
        # says what the step does, waiting for its turn included.
        step = event.then(h.run, settings, view, api_name=api_name, show_progress="hidden", **MODEL)
        step.then(h.enable_input, None, [c.chat_input, *controls], api_name=False, **FAST)
        step.then(h.workspace_panel, None, c.workspace_view, api_name=False, **FAST)  # "not saved yet · …"
        return step

    # Chat box: record -> read attachments -> feed and answer.
    submitted = c.chat_input.submit(h.submit, c.chat_input, [c.chat_input, *view], api_name="submit", **FAST)
    read = submitted.then(h.read, None, view, api_name="read", **READ)
    then_model(read, "run")
    # Beside the model step: the box opens once the question is answered, though documents may still be fed after it.
    submitted.then(h.open_input_once_answered, None, c.chat_input, api_name=False, **FAST)

    # Documents panel.
    uploaded = c.upload.upload(h.add_files, c.upload, [c.upload, *view], api_name="add_files", **FAST)
    then_model(uploaded.then(h.read, None, view, api_name=False, **READ), api_name=False)
    if c.server_path is not None:
        added = c.add_path.click(h.add_server_path, c.server_path, [c.server_path, *view], api_name="add_path", **FAST)
        then_model(added.then(h.read, None, view, api_name=False, **READ), api_name=False)

    # Stop / cancel: only a flag, so it is never stuck behind the work it stops; then the note and the
    # buttons as the work stands.
    for button, api_name in ((c.stop, "stop"), (c.cancel, False)):
        stopped = button.click(h.stop, None, c.stop_note, api_name=api_name, **FAST)
        stopped.then(h.controls, None, controls, api_name=False, **FAST)

    # Settings → Model: a restart with another model (model_switch.py); the page waits for it and reloads.
    switched = c.switch_model.click(h.switch_model, c.model_choice, [c.model_note, c.restarting],
                                    api_name="switch_model", **FAST)
    switched.then(None, c.restarting, None, js=RELOAD_WHEN_BACK, api_name=False, **FAST)

    c.remove_choice.focus(h.removable, c.remove_choice, c.remove_choice, api_name=False, **FAST)
    removed = then_model(c.remove.click(h.queue_remove, c.remove_choice, view, api_name="remove", **FAST), api_name=False)
    removed.then(h.removable, c.remove_choice, c.remove_choice, api_name=False, **FAST)
    c.answer_from.input(h.switch_documents, c.answer_from, None, api_name="answer_from", **FAST)
    then_model(c.regenerate.click(h.queue_regenerate, None, view, api_name="regenerate", **FAST), api_name=False)
    then_model(c.clear.click(h.queue_forget, None, view, api_name="clear", **FAST), api_name=False)
    # A question edited in the chat (its pencil) is asked again in the new words where it was asked.
    then_model(c.chatbot.edit(h.edit_question, None, view, api_name=False, **FAST), api_name=False)
    # The chat's own trash icon empties only the browser's copy: it clears the chat as the button does.
    then_model(c.chatbot.clear(h.queue_forget, None, view, api_name=False, **FAST), api_name=False)
    # New context in a browser is a new workspace, the one left saved (wire_workspaces); an API client's session,
    # never saved, is emptied in place.
    then_model(c.reset_trigger.click(h.queue_reset, None, view, api_name="new_context", **FAST), api_name=False)
    c.export.click(h.export, None, c.export_files, api_name="export", **FAST)

    # The one-call API (app/web/api.py): add files, ask, get JSON; all on the model queue.
    c.ask_trigger.click(h.ask, [c.ask_question, c.ask_files], c.ask_result, api_name="ask", **MODEL)

    # The live panel: whole on page load (and for API clients), then only what changed on each tick.
    live = [c.panel, c.memory_plot, c.throughput_plot, c.panel_data, c.decode_plot]  # the numbers stay 4th (/panel)
    demo.load(h.panel, None, live, api_name="panel", **FAST)
    c.timer.tick(h.tick, None, live, api_name=False, **FAST)
    c.show_trigger.click(h.show, None, view, api_name="show", **FAST)  # for API clients
    wire_workspaces(demo, c, h, then_model)
    demo.unload(h.unload)


def wire_workspaces(demo, c: Components, h: Handlers, then_model) -> None:
    """Page load shows the workspace the browser remembers; open, new, save, rename, delete, download, import."""
    shown = [c.workspace_id, *c.view, *c.workspace_view]  # a switch changes everything on screen
    demo.load(h.page_load, c.workspace_id, shown, api_name=False, **FAST)
    c.workspaces.select(h.choose_listed, None, c.workspace_choice, api_name=False, **FAST)  # a row clicked
    c.open_workspace.click(h.open_workspace, c.workspace_choice, shown, api_name=False, **FAST)
    c.new_workspace.click(h.new_workspace, None, shown, api_name=False, **FAST)
    c.new_context.click(h.new_context, None, shown, api_name=False, **FAST)
    then_model(c.save.click(h.queue_save, c.workspace_name, c.view, api_name="save", **FAST), api_name=False)
    c.workspace_name.submit(h.rename, c.workspace_name, c.workspace_view, api_name=False, **FAST)
    c.workspace_name.blur(h.rename, c.workspace_name, c.workspace_view, api_name=False, **FAST)
    c.delete_workspace.click(h.delete_workspace, c.workspace_choice, c.workspace_view, api_name=False, **FAST)
    c.download_workspace.click(h.download_workspace, c.workspace_choice, c.workspace_file, api_name=False, **FAST)
    c.import_file.upload(h.import_workspace, c.import_file, [c.import_file, *shown], api_name=False, **FAST)
