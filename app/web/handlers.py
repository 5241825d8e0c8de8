"""Event functions: component values and the request in, updated session and component values out.

A user action is split by cost. A fast step (no queue limit) records it in the session and shows it;
``read`` parses files on the reading queue (session/reading.py: one at a time, off the model queue, so a 300-page
PDF does not hold up other users' answers); ``run`` does all model work (session/model_work.py): sessions' model
steps run side by side and take turns at the model (engine/model_gate.py).
Stop only sets the action's cancel flag: the engine halts within one chunk or token and rolls back, and
the generator then shows the final state itself.
"""

from __future__ import annotations

import asyncio
import os
import time
from urllib.parse import unquote

import gradio as gr

import lminfinite
from ingest.git_url import looks_like_url

from ..cli import AppConfig
from ..engine import bundled_model
from ..engine.budget import Budget
from ..engine.generation import GenerationSettings
from ..engine.metrics import device_memory, stats_dict
from ..engine.replay import DOCUMENTS_ONLY, before_exchange, replay_cost, without_source
from ..engine.runtime import ModelRuntime
from ..session.uploads import plural, screen_uploads, upload_paths
from ..session.exporting import export_data, write_exports
from ..session.model_work import ModelWork
from ..session.question_limit import QuestionLimit
from ..session.reading import Reader
from ..session.answer_from import answer_choices
from ..session.removal import removal_choices, removal_label
from ..session.registry import SessionDenied, SessionExpired, SessionRegistry
from ..session.state import ChatItem, ItemKind, Session, Stage, Work, WorkKind
from ..session.text import clean_text
from . import messages, views
from .api import answer_json, feed_json
from .model_switch import ModelSwitch
from .replica_cookie import served_elsewhere
from .tab_sent import TabSent
from .unattended import finish_unattended
from .workspace_handlers import WorkspaceEvents


CONFIRM_S = 20.0  # a costly action's second click counts as "yes" this long after the first
SAMPLE_EVERY_S = 0.9  # the plots' sampling interval: a little under the panel timer's 1 s tick (ui.py)
FOLLOW_S = 0.25  # how often a request whose actions another request runs refreshes its view while it waits


class Handlers(WorkspaceEvents):
    def __init__(self, registry: SessionRegistry, runtime: ModelRuntime, config: AppConfig, budget: Budget,
                 upload_root: str | None, default_settings: dict | None = None):
        self.registry = registry
        self.model_switch = ModelSwitch()  # app.py restarts with the model it is asked for
        self.runtime = runtime
        self.config = config
        self.budget = budget
        self.upload_root = upload_root
        # What an unpatched model's cache adds per token: the panel's "a full cache would hold" figure.
        self.vanilla_token_bytes = lminfinite.KVShape.from_config(runtime.model.config).token_bytes(runtime.dtype)
        self.reader = Reader(runtime, config)
        self.model_work = ModelWork(runtime, budget, registry.cache_bytes, registry.save_now,
                                    config.answer_while_feeding)
        self.default_settings = default_settings or {}  # run's settings by name, as the Settings panel starts
        self.question_limit = QuestionLimit(runtime.tokenizer, config.max_question_tokens)
        self.tab_sent = TabSent()  # per tab: several tabs can show one workspace

    # -- helpers ---------------------------------------------------------------------------------
    def _session(self, request: gr.Request, *, touch: bool = True) -> Session:
        if request is None or not request.session_hash:
            raise messages.error("This request has no session; reload the page.")
        self._check_served_here(request)
        try:
            return self.registry.get(request.session_hash, touch=touch, owner=self._user(request))
        except SessionDenied:
            raise messages.error(messages.ANOTHER_USERS_SESSION) from None
        except SessionExpired:
            if touch:  # a user action (not the panel timer): tell once, then the tab may start afresh
                self.registry.forget_expired(request.session_hash)
            minutes = self.config.session_timeout_s / 60
            raise messages.error(f"This workspace was freed after {minutes:g} minutes without activity (saved "
                                 "first, when it was open in a browser). Reload the page to reopen it.") from None

    def _check_served_here(self, request: gr.Request) -> None:
        """A tab whose page another replica served (it stopped, and the proxy sent this request here) is told to
        reload, which reopens its workspace here, rather than given a new, empty one."""
        elsewhere = served_elsewhere(request, self.config.replica_name)
        if elsewhere is not None and self.registry.peek(request.session_hash) is None:
            raise messages.error(f"This page was served by replica “{unquote(elsewhere)}”, which is not answering; "
                                 "reload the page to reopen your workspace here.")

    def _check_question(self, question: str | None) -> None:
        """Refuse (gr.Error, nothing queued) a question longer than --max-question-tokens, before it waits for the
        model; the chat box keeps the text, to shorten or attach as a file."""
        refusal = self.question_limit.refusal(question) if question else None
        if refusal is not None:
            raise messages.error(refusal)

    @staticmethod
    def _user(request: gr.Request) -> str | None:
        """The logged-in user (with --auth); None without a login."""
        return getattr(request, "username", None) or None

    def view(self, session: Session, tab: str, *, full: bool = True) -> tuple:
        """The outputs of every work event: chat, documents table, context summary and activity, then the
        controls that follow the work: the stop note, the export's files (hidden once the chat has moved on
        from what they hold), and Stop and Cancel (active only while this session has work to stop).

        ``full=False`` (progress while reading and feeding) skips the documents table when ``tab`` was
        already sent it: a 10,000-file archive's table costs Gradio more to post-process than the model
        takes to read the files.
        """
        chat, rows, context, activity = views.session_view(session, self.budget)
        sent = self.tab_sent.get(session, tab)
        shown_rows = gr.skip() if not full and rows == sent.get("rows") else rows
        self.tab_sent.update(session, tab, rows=rows)
        export = gr.skip()
        if sent.get("exported") is not None and sent["exported"] != chat:
            self.tab_sent.update(session, tab, exported=None)
            export = gr.update(value=None, visible=False)
        note, busy = self._controls_state(session)
        return (chat, shown_rows, context, activity, note, export, gr.update(interactive=busy),
                gr.update(interactive=busy), self._answer_from(session) if full else gr.skip())

    @staticmethod
    def _answer_from(session: Session):
        """The "Answer from" list: every document in the context, checked unless switched off."""
        choices = answer_choices(session.documents)
        off = session.answering_off()
        return gr.update(choices=choices, value=[value for _, value in choices if value not in off])

    def switch_documents(self, on: list[str], request: gr.Request):
        """The user checked or unchecked a document in "Answer from": it takes effect at the next question."""
        self._session(request).switch_documents(list(on or []))

    @staticmethod
    def _controls_state(session: Session) -> tuple[str, bool]:
        """The stop note as Markdown that shows it literally (it quotes names and files), and whether there is
        work to stop."""
        note, busy = session.controls_state()
        return messages.markdown_text(note), busy

    def progress_view(self, session: Session, tab: str) -> tuple:
        """The view while work streams: only what changed is post-processed and sent."""
        return self.view(session, tab, full=False)

    def _progress(self, request: gr.Request, session: Session, steps):
        """``steps`` (a reading or model step) streamed as this tab's view of ``session``."""
        return relayed(steps, lambda: self.progress_view(session, request.session_hash))

    def _queue_sources(self, session: Session, question: str | None, paths: list[str], *, uploads: bool) -> Work:
        names = [os.path.basename(p.rstrip("/")) or p for p in paths]
        if uploads:
            accepted, refused = screen_uploads(paths, self.config.max_file_size, self.upload_root)
        else:
            accepted, refused = paths, []
        question_item = status_item = None
        if question or names:
            question_item = ChatItem("user", ItemKind.QUESTION, question or "", files=names)
        if names:
            title = f"Reading {plural(len(accepted), 'file')}" if accepted else "No file could be read"
            lines = [f"{r.path}: {r.reason}" for r in refused]
            status_item = ChatItem("assistant", ItemKind.STATUS, "\n".join(lines), title=title, pending=bool(accepted))
        return session.new_work(WorkKind.TURN, question, accepted, question_item=question_item,
                                status_item=status_item, refused=refused)

    # -- fast steps ------------------------------------------------------------------------------
    def submit(self, message, request: gr.Request):
        """Chat box: queue the attached files and the question; lock the box until the answer is done (files alone
        leave it open: a question asked while they are fed is answered meanwhile, model_work.py)."""
        session = self._session(request)
        message = message or {}
        text = clean_text(str(message.get("text") or "")).strip()
        files = upload_paths(message.get("files"))
        if not text and not files:
            return (gr.MultimodalTextbox(value=None, interactive=True), *self.view(session, request.session_hash))
        self._check_question(text)
        self._queue_sources(session, text or None, files, uploads=True)
        return (gr.MultimodalTextbox(value=None, interactive=not text), *self.view(session, request.session_hash))

    def add_files(self, files, request: gr.Request):
        """Documents panel: queue uploaded files (no question)."""
        session = self._session(request)
        paths = upload_paths(files)
        if paths:
            self._queue_sources(session, None, paths, uploads=True)
        return (None, *self.view(session, request.session_hash))

    def add_server_path(self, path: str, request: gr.Request):
        """A folder, file or git URL on the server; only with --allow-local-paths."""
        session = self._session(request)
        path = clean_text(str(path or "")).strip()
        if not self.config.local_paths_enabled:
            raise messages.error("Reading paths on the server is off; the server owner can enable "
                                 "--allow-local-paths.")
        if path and not looks_like_url(path):  # git URLs: ingest accepts https only, and clones to a temp folder
            resolved = self.config.local_path_allowed(path)
            if resolved is None:
                raise messages.error("That path is outside the folders this server allows (--allow-local-paths); "
                                     "nothing was read.")
            path = str(resolved)  # read what was checked, not a link that could change in between
        if path:
            self._queue_sources(session, None, [path], uploads=False)
        return ("", *self.view(session, request.session_hash))

    def stop(self, request: gr.Request):
        """Stop this session's running and queued work (the engine rolls back within a chunk or token)."""
        session = self._session(request)
        session.stop(say=True)
        return self._controls_state(session)[0]

    def controls(self, request: gr.Request):
        """The stop note and Stop / Cancel as the work now stands, after Stop and after the model step: the
        replies of events running side by side can reach the browser in either order."""
        note, busy = self._controls_state(self._session(request, touch=False))
        return note, gr.update(interactive=busy), gr.update(interactive=busy)

    def queue_regenerate(self, request: gr.Request):
        """One rule: Regenerate answers the last question again, in its place. A stopped answer was not kept, so
        its question is asked again and the stopped exchange gives way to it (it stayed above as a second turn,
        while Regenerate after an answer replaced it)."""
        session = self._session(request)
        answer = next((c for c in reversed(session.chat) if c.kind == ItemKind.ANSWER), None)
        question = next((c for c in reversed(session.chat) if c.kind == ItemKind.QUESTION and c.text), None)
        if answer is not None and answer.in_context and session.engine is not None and session.engine.can_regenerate:
            session.new_work(WorkKind.REGENERATE)
        elif question is not None and not question.in_context:
            with session.lock:
                stopped = session.answer_to(question)
                session.drop_items([question, stopped])
                session.new_work(WorkKind.TURN, question.text,
                                 question_item=ChatItem("user", ItemKind.QUESTION, question.text))
        else:
            messages.warning("Nothing to regenerate: ask a question first (documents added after the last answer "
                             "make it permanent).")
        return self.view(session, request.session_hash)

    def edit_question(self, edit: gr.EditData, request: gr.Request):
        """The user edited one of their questions in the chat: ask it in the new words where it was asked. The
        context is read again with the exchanges before it (the cost is said first, as for Remove: the same edit
        again goes ahead), and the question's answer and the exchanges after it leave the chat."""
        session = self._session(request)
        index = edit.index if isinstance(edit.index, int) else None
        item = self._editable_question(session, index)
        text = clean_text(views.typed_text(edit.value)).strip()
        if item is None:
            messages.warning("Only a question that was answered and is still in the context can be edited.")
            return self.view(session, request.session_hash)
        if not text or text == item.text:
            return self.view(session, request.session_hash)  # the chat shows the question as it was
        self._check_question(text)
        cost, what = self._edit_cost(session, item)
        if self._confirm_cost(session, ("edit", index, text), cost, what, "Make the same edit again to go ahead."):
            session.new_work(WorkKind.EDIT, text, question_item=ChatItem("user", ItemKind.QUESTION, text), edited=item)
        return self.view(session, request.session_hash)

    @staticmethod
    def _editable_question(session: Session, index: int | None) -> ChatItem | None:
        """The chat's item at ``index`` when it is a question that was answered and is still in the context."""
        with session.lock:
            item = session.chat[index] if index is not None and 0 <= index < len(session.chat) else None
        if item is None or item.kind != ItemKind.QUESTION or not item.in_context or not item.text \
                or session.engine is None or session.answer_to(item) is None:
            return None
        return item

    @staticmethod
    def _edit_cost(session: Session, item: ChatItem) -> tuple[int, str]:
        """Tokens read again to ask ``item`` in new words (at least 1: the edit is always confirmed), and what
        that does."""
        kept = session.exchanges_before(item)
        later = sum(1 for c in session.chat[session.chat.index(item):] if c.kind == ItemKind.ANSWER and c.in_context)
        cost = replay_cost(session.engine, before_exchange(kept))
        what = (f"Asking this question in new words reads the context again up to it (the "
                f"{plural(later, 'exchange')} from it on leave the chat)")
        return max(cost, 1), what

    def _confirm_cost(self, session: Session, action: tuple, cost: int, what: str,
                      again: str = "Click again to go ahead.") -> bool:
        """A rebuild costs a re-read: the first request says how much (tokens, and time at the measured prefill
        rate), the same request again within CONFIRM_S goes ahead."""
        if not cost or session.confirmed(action, CONFIRM_S):
            return True
        rate = session.stats.prefill_tps or session.last_prefill_rate()  # after a reopen: the answers' own
        took = f", about {views.fmt_seconds(cost / rate)} at {rate:,.0f} tokens/s" if rate else ""
        session.stop_note = f"{what}: {cost:,} tokens{took}. {again}"
        messages.info(session.stop_note)  # also where the eye is: the note is under the chat, the button may not be
        return False

    def switch_model(self, choice, request: gr.Request):
        """Settings → Model: the first click says what a switch does (a restart: every open workspace saved, the
        other tabs interrupted, contexts opening under the model that read them), the second within CONFIRM_S asks
        app.py for it. Returns the note under the button and whether the page should wait for the restart."""
        session = self._session(request)
        model = bundled_model.BUNDLED.get(choice) if choice in bundled_model.installed_names() else None
        if model is None:
            messages.warning("Choose one of the installed models.")
            return "", False
        if choice == self.runtime.bundled_name:
            return f"{model.display_name} is the model running now.", False
        if not self.config.model_switch:
            messages.warning("This server was started with --no-model-switch: the model cannot be switched here.")
            return "", False
        if self.config.share:
            messages.warning("With --share a restart would make a new public link: stop the server and start it "
                             f"with --model {choice}.")
            return "", False
        if self.model_switch.requested:
            return f"The server is restarting with {self.model_switch.model}.", True
        if not session.confirmed(("model", choice), CONFIRM_S):
            others = self.registry.other_tabs(request.session_hash)
            note = (f"Switching to {model.display_name} restarts the server with it (loading takes a minute or "
                    "more; the first time it is also converted). Every workspace open in a browser is saved first "
                    f"and stays in the Workspaces list; a context opens only under the model that read it. "
                    + (f"{plural(others, 'other tab')} connected now will be interrupted and reload. " if others
                       else "") + "Click again to switch.")
            messages.info(note)
            return note, False
        self.model_switch.request(choice)
        return (f"Restarting with {model.display_name}: this page reloads by itself when the model is loaded "
                "(your workspace is saved first)."), True

    def queue_forget(self, request: gr.Request):
        """Clear chat; when that means reading the documents again, say what it costs first."""
        session = self._session(request)
        engine = session.engine
        cost = replay_cost(engine, DOCUMENTS_ONLY) if engine is not None and not engine.forgets_by_rollback else 0
        if self._confirm_cost(session, ("forget",), cost,
                              "Clearing the chat reads the documents again without the conversation"):
            session.new_work(WorkKind.FORGET)
        return self.view(session, request.session_hash)

    def queue_remove(self, source, request: gr.Request):
        """Remove one document, or an archive's files: the rest of the context (documents and conversation) is
        read again without them."""
        session = self._session(request)
        if not source or session.engine is None or source not in self._removable(session):
            messages.warning("Choose a document that is in the context.")  # no error: it would paint the chat red
            return self.view(session, request.session_hash)
        cost = replay_cost(session.engine, without_source(source))
        if self._confirm_cost(session, ("remove", source), max(cost, 1),
                              f"Removing {removal_label(source, session.documents)} reads the rest of the context "
                              "again"):
            session.new_work(WorkKind.REMOVE, removing=source)
        return self.view(session, request.session_hash)

    @staticmethod
    def _removable(session: Session) -> list[str]:
        return [value for _, value in removal_choices(session.documents)]

    def removable(self, current, request: gr.Request):
        """The Remove list, filled when it is opened; the choice is kept while its file is still in the context."""
        choices = removal_choices(self._session(request, touch=False).documents)
        return gr.Dropdown(choices=choices, value=current if current in {v for _, v in choices} else None)

    def queue_reset(self, request: gr.Request):
        session = self._session(request)
        session.stop()
        session.new_work(WorkKind.RESET)
        return self.view(session, request.session_hash)

    def show(self, request: gr.Request):
        """The session as it is (page load, and for API clients)."""
        return self.view(self._session(request), request.session_hash)

    async def open_input_once_answered(self, request: gr.Request):
        """Unlock the chat box as soon as no question of this session waits for its answer. A question asked with a
        long document (or while one is fed) is answered between two chunks of the feed (model_work.py): the box
        opens then, not when the whole feed is over (``enable_input``, after the model step). Awaits on the event
        loop: no worker thread is held while it waits."""
        session = self._session(request, touch=False)
        while session.awaits_an_answer() and not session.closed:
            await asyncio.sleep(FOLLOW_S)
        return gr.MultimodalTextbox(interactive=True)

    def enable_input(self, request: gr.Request):
        """After the model step: unlock the chat box, and settle the stop note and Stop / Cancel."""
        return gr.MultimodalTextbox(interactive=True), *self.controls(request)

    def export(self, request: gr.Request):
        session = self._session(request)
        data = export_data(model=self.runtime.name, system_prompt=session.system_prompt,
                           documents=session.documents, chat=session.chat, context_tokens=session.context_tokens)
        self.tab_sent.update(session, request.session_hash, exported=views.chat_messages(session.chat))
        return gr.File(value=write_exports(data, session.tmpdir), visible=True)

    def _panel_numbers(self, session: Session) -> tuple[str, dict, object]:
        """The panel's HTML and raw numbers, after taking this tick's sample for the plots."""
        memory = device_memory(self.runtime.device_type)
        session.series.record(memory, session.stats, every_s=SAMPLE_EVERY_S)  # once per tick, however many tabs
        vanilla = session.stats.context_tokens * self.vanilla_token_bytes
        data = stats_dict(session.stats, memory)
        budget = session.budget_tokens
        data.update(budget=budget, recall_kept=session.recall_kept, vanilla_kv_bytes=vanilla,
                    sessions=len(self.registry), window=self.runtime.window,
                    n_starting=self.runtime.lm_config.n_starting)
        return views.panel_html(session.stats, memory, budget, vanilla), data, memory

    def panel(self, request: gr.Request):
        """Page load and API: the whole live panel (device memory, KV bytes, throughput, both plots)."""
        session = self._session(request, touch=False)
        html, data, memory = self._panel_numbers(session)
        memory_frame, prefill_frame, decode_frame = views.plot_frames(session.series.snapshot(), memory.kind)
        self.tab_sent.update(session, request.session_hash, html=html, data=views.panel_key(html, data),
                             plots=session.series.version)
        return html, memory_frame, prefill_frame, data, decode_frame

    def tick(self, request: gr.Request):
        """Timer tick: only what changed since this tab's last tick, gr.skip() for the rest.

        An idle tab then costs next to nothing: no plot frames built or sent, nothing redrawn in the browser.
        The plots change only with a new sample (series.record takes none while idle).
        """
        try:
            session = self._session(request, touch=False)
        except gr.Error:  # freed or not this user's: the panel just stops changing (actions say why)
            return (gr.skip(),) * 5
        html, data, memory = self._panel_numbers(session)
        shown = self.tab_sent.get(session, request.session_hash)
        version, key = session.series.version, views.panel_key(html, data)
        plots = (gr.skip(), gr.skip(), gr.skip())
        if shown.get("plots") != version:
            plots = views.plot_frames(session.series.snapshot(), memory.kind)
        self.tab_sent.update(session, request.session_hash, html=html, data=key, plots=version)
        memory_plot, prefill_plot, decode_plot = plots
        return (html if shown.get("html") != html else gr.skip(), memory_plot, prefill_plot,
                data if shown.get("data") != key else gr.skip(), decode_plot)

    def unload(self, request: gr.Request):
        """The tab disconnected: stop its work and free its context."""
        if request is not None and request.session_hash:
            if self.registry.close(request.session_hash, owner=self._user(request), as_user=True):
                self.tab_sent.forget(request.session_hash)

    def ask(self, question, files, request: gr.Request):
        """API ``/ask``: add ``files`` (may be empty) to this session's context, then answer ``question``.

        Uses the Settings' defaults of the server (greedy unless the model asks otherwise, recall on). A generator
        that sends nothing until the JSON at the end: Gradio closes it when the call is cancelled
        (gradio_client's ``job.cancel()``) or its client leaves, and the session's work then stops as with
        Stop. A plain function ran to the end in its thread, for nobody.

        A question answered while its documents are still fed is replied to then: the feed goes on unattended
        (unattended.py), and the context reads the exchange once it is over, as in the chat.
        """
        session = self._session(request)
        paths = upload_paths(files)
        question = clean_text(str(question or "")).strip()
        if not question and not paths:
            raise messages.error("Give a question, files, or both.")
        self._check_question(question)
        work = self._queue_sources(session, question or None, paths, uploads=True)
        steps = self.run(**self.default_settings, request=request)  # or follows the request running them
        try:
            yield from unsent(self.read(request))
            for _ in steps:
                if question and self._answered_beside_its_feed(session, work.question_item):
                    finish_unattended(steps, f"feed of workspace {session.workspace_id}")
                    steps = None
                    break
                yield gr.skip()
        except GeneratorExit:  # the call ended: its own step rolls back as it closes; the rest is Stop's
            steps.close()
            session.stop()
            raise
        finally:
            if steps is not None:
                steps.close()
        answer = session.answer_to(work.question_item) if question else None
        rows = work.rows or [r for r in session.documents if r.path in {os.path.basename(p) for p in paths}]
        feeding = session.engine is not None and session.engine.feeding
        yield answer_json(answer, rows, session.context_tokens, self.runtime.name,
                          feed_json(session.stats) if feeding else None)

    @staticmethod
    def _answered_beside_its_feed(session: Session, question: ChatItem) -> bool:
        """``question`` has its answer, and what is left is the feed it was answered beside."""
        answer = session.answer_to(question)
        return answer is not None and not answer.pending and session.only_feeding_left()

    # -- reading queue ---------------------------------------------------------------------------
    def read(self, request: gr.Request):
        """Parse the oldest queued files with ingest, streaming progress; the model is not touched."""
        session = self._session(request)
        work = session.next_work(Stage.QUEUED)
        if work is not None and not work.reading:
            with session.working():
                yield from self._progress(request, session, self.reader.read(session, work))
        yield self._tab_view(request, session)

    # -- model queue -----------------------------------------------------------------------------
    def run(self, system_prompt, temperature, top_p, max_new_tokens, repetition_penalty, recall, topk, quote, guess,
            request: gr.Request):
        """Do this session's ready work in order: feed documents, answer, regenerate, clear, reset."""
        session = self._session(request)
        try:
            settings = GenerationSettings.from_ui(temperature, top_p, max_new_tokens, repetition_penalty, recall, topk,
                                                  quote, guess)
        except (TypeError, ValueError) as exc:
            raise messages.error(f"Invalid setting: {exc}") from exc
        prompt = clean_text(str(system_prompt or ""))  # the Settings' text, from a client: UTF-8 only
        with session.working():
            if (yield from self._claim_or_follow(request, session)):
                try:
                    while (work := session.next_model_work()) is not None:
                        if work.stage == Stage.QUEUED:  # a client that skipped the reading step
                            yield from self._progress(request, session, self.reader.read(session, work))
                        try:
                            yield from self._progress(request, session,
                                                      self.model_work.run(session, work, settings, prompt))
                        finally:
                            session.finish_work(work)
                finally:
                    session.release_model_step()
        yield self._tab_view(request, session)

    def _claim_or_follow(self, request: gr.Request, session: Session):
        """Become the session's model step (True), or, while another request of it (a button, another tab) runs
        its actions, this one's included, follow it until they are done (False): this request's chat box and
        Stop then settle with the work, not before it."""
        while not session.claim_model_step():
            if not session.has_work or session.closed or session.only_feeding_left():
                return False
            time.sleep(FOLLOW_S)
            yield self.progress_view(session, request.session_hash)
        return True

    def _tab_view(self, request: gr.Request, session: Session) -> tuple:
        """The view of what the tab shows now: a tab switched to another workspace while ``session``'s step ran
        must not be sent the old chat."""
        return self.view(self.registry.peek(request.session_hash) or session, request.session_hash)


def relayed(steps, each):
    """A step's progress sent as ``each()`` at each of its yields: each is where Gradio may close the request.
    Closing this closes ``steps`` at once, so its work rolls back now, not when it is collected."""
    try:
        for _ in steps:
            yield each()
    finally:
        steps.close()


def unsent(steps):
    """A step's progress with nothing sent (``gr.skip()``)."""
    return relayed(steps, gr.skip)
