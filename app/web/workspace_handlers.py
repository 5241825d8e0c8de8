"""The Workspaces tab's events: which workspace a tab shows (page load, open, new), save, rename, delete,
download and import. Part of Handlers (handlers.py), whose session lookup and views they use."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from ingest.units import human_bytes

from ..session.uploads import upload_paths
from ..session.registry import SessionDenied
from ..session.state import Session, WorkKind
from ..session.workspace_file import WorkspaceFileError, check_compatible
from ..session.workspace_quota import QuotaExceeded, check_quota
from ..session.workspace_store import MAX_NAME_CHARS, cut_name, is_workspace_id
from . import messages, views
from .ui import VIEW
from .workspace_views import chosen_row, reopening_chat, workspace_choices, workspace_note, workspace_rows


class WorkspaceEvents:
    def workspace_view(self, session: Session) -> tuple:
        """The Workspaces tab: this workspace's name and where it stands on disk, the user's saved workspaces."""
        saved = self.registry.store.list(session.owner)
        mine = next((w for w in saved if w.id == session.workspace_id), None)
        return (session.name, workspace_note(session, mine), workspace_rows(saved, session.workspace_id, self.runtime.name),
                gr.Dropdown(choices=workspace_choices(saved), value=None))

    def _shown(self, request: gr.Request, session: Session, note: str = "") -> tuple:
        """After a page load or a switch: the workspace id the browser keeps, and everything on screen."""
        if note:
            messages.info(note)
        return (session.workspace_id, *self.view(session, request.session_hash), *self.workspace_view(session))

    def _attach(self, request: gr.Request, workspace_id, **how) -> tuple:
        """registry.attach for this request's tab and user; a tab showing another user's session is refused."""
        if request is None or not request.session_hash:
            raise messages.error("This request has no session; reload the page.")
        try:
            return self.registry.attach(request.session_hash, workspace_id, self._user(request), **how)
        except SessionDenied:
            raise messages.error(messages.ANOTHER_USERS_SESSION) from None

    def attach(self, workspace_id, request: gr.Request):
        """Page load: show the workspace this browser had open (reopened from disk if it was freed)."""
        session, note = self._attach(request, workspace_id, page_load=True)
        return self._shown(request, session, note)

    def page_load(self, workspace_id, request: gr.Request):
        """The page-load event: ``attach``, showing meanwhile which saved workspace is being read back."""
        reopening = self._reopening(workspace_id, request)
        if reopening is not None:
            yield reopening
        yield self.attach(workspace_id, request)

    def _reopening(self, workspace_id, request: gr.Request) -> tuple | None:
        """What the tab shows while ``workspace_id`` is read back from disk; None when it is live or not saved."""
        owner = self._user(request)
        if not self.registry.will_reopen(workspace_id, owner):
            return None
        saved = next((w for w in self.registry.store.list(owner) if w.id == workspace_id), None)
        if saved is None:
            return None
        skip = gr.skip()
        view = [skip] * len(VIEW)  # Handlers.view's outputs: the chat (first) and the activity (fourth) change
        view[0], view[3] = reopening_chat(saved), views.reopening_activity(saved.name)
        return (skip, *view, saved.name,
                f"Reopening “{saved.name}”: reading {human_bytes(saved.size)} back into memory…", skip, skip)

    def _refused(self, why: str, request: gr.Request) -> tuple:
        """A switch that cannot be made: say why and show the tab's workspace as it was (a gr.Error would mark
        every output, the chat included, as failed)."""
        messages.warning(why)
        return self._shown(request, self._session(request))

    def open_workspace(self, choice, request: gr.Request):
        """Open a saved workspace in this tab; the one it leaves is saved. Always answers: the one already shown
        says so, and one read back from disk shows that it is being read."""
        if not choice:
            yield self._refused("Choose a saved workspace first.", request)
            return
        current = self.registry.peek(request.session_hash) if request is not None else None
        if current is not None and current.workspace_id == choice:
            yield self._shown(request, current, f"“{current.name}” is the workspace open in this tab.")
            return
        reopening = self._reopening(choice, request)
        if reopening is not None:
            yield reopening
        session, note = self._attach(request, choice, fallback_new=False)
        if session is None:  # the tab keeps its workspace and its queued work; the note says why
            yield self._refused(note or "That workspace no longer exists.", request)
            return
        yield self._shown(request, session, note)

    def new_workspace(self, request: gr.Request):
        """An empty workspace in this tab; the one it leaves is saved."""
        session, _ = self._attach(request, None)
        return self._shown(request, session)

    def new_context(self, request: gr.Request):
        """New context: a new, empty workspace in this tab, the one left saved and kept in the list. Emptying it in
        place saved nothing over its last save, so one click lost 13 minutes of work."""
        left = self.registry.peek(request.session_hash) if request is not None else None
        kept = left is not None and not left.pristine  # asked before the switch: a freed session is emptied
        session, _ = self._attach(request, None)
        if kept and left is not session:
            self.registry.retire_left(left)  # saved now: the list shows it on this screen
        return self._shown(request, session, f"“{left.name}” is kept in Workspaces, saved as you left it; this is a "
                                             "new, empty workspace." if kept and left is not session else "")

    def queue_save(self, name, request: gr.Request):
        """Save after the actions queued before it (the model step writes the file, then records the name: a save
        that fails, or is killed, leaves the list naming what the file holds)."""
        session = self._session(request)
        self._name(session, name, record=False)
        session.new_work(WorkKind.SAVE)
        return self.view(session, request.session_hash)

    def rename(self, name, request: gr.Request):
        """Name this workspace: on one line, cleaned of what UTF-8 cannot hold, cut (saying so) when too long."""
        session = self._session(request)
        self._name(session, name, record=True)
        return self.workspace_view(session)

    def _name(self, session: Session, name, *, record: bool) -> None:
        """Give ``session`` the name asked for; ``record``: rename its saved file in the list now, too."""
        name, cut = cut_name(str(name or ""))
        if cut:
            messages.warning(f"A workspace name has at most {MAX_NAME_CHARS} characters; it was cut to “{name}”.")
        if name and name != session.name:
            session.name = name
            if record and self.registry.store.exists(session.owner, session.workspace_id):
                self.registry.store.set_name(session.owner, session.workspace_id, name)

    def delete_workspace(self, choice, request: gr.Request):
        """Delete a saved workspace, never the one open in a tab (it would be saved again when left)."""
        session = self._session(request)
        if not is_workspace_id(choice):
            raise messages.error("Choose a saved workspace first.")
        if self.registry.is_open(choice):
            raise messages.error("That workspace is open (here or in another tab): open or start another one first.")
        elsewhere = self.registry.open_elsewhere(session.owner, choice)
        if elsewhere is not None:
            raise messages.error(f"That workspace was not deleted: {elsewhere}.")
        self.registry.store.delete(session.owner, choice)
        return self.workspace_view(session)

    def download_workspace(self, choice, request: gr.Request):
        """A saved workspace as one file, to import on another machine running the same model."""
        session = self._session(request)
        choice = choice or session.workspace_id
        if not self.registry.store.exists(session.owner, choice):
            raise messages.error("This workspace has not been saved yet: press Save first.")
        name = self.registry.store.name(session.owner, choice, "workspace")
        link = self.registry.store.download_link(session.owner, choice, session.workspace_id, name)
        return gr.update(value=str(link), visible=True)  # an update: a gr.File(value=…) copies it into the cache

    def import_workspace(self, upload, request: gr.Request):
        """A downloaded workspace file: checked against this server's model and settings, added to the user's
        workspaces, and opened in this tab."""
        paths = upload_paths([upload] if upload and not isinstance(upload, list) else upload)
        if not paths:
            return None, *self._refused("Choose a workspace file (.lmiw) to import.", request)
        owner = self._user(request)
        try:
            summary = check_compatible(Path(paths[0]), self.runtime)
            check_quota(self.registry.store, owner, None, Path(paths[0]).stat().st_size, self.config.workspace_quota,
                        "importing it")
        except (WorkspaceFileError, QuotaExceeded) as exc:
            return None, *self._refused(f"Not imported: {exc}", request)
        name, cut = imported_name(summary.name)
        workspace_id = self.registry.store.add(owner, Path(paths[0]), name)
        try:
            session, note = self._attach(request, workspace_id, fallback_new=False)
        except gr.Error:  # another user's tab: nothing is kept
            self.registry.store.delete(owner, workspace_id)
            raise
        if session is None:  # the header was fine, the tensors were not: the tab keeps its workspace
            self.registry.store.delete(owner, workspace_id)
            return None, *self._refused(f"Not imported: {note}", request)
        if cut:
            note += f" Its name had more than {MAX_NAME_CHARS} characters and was cut."
        return None, *self._shown(request, session, note)

    def workspace_panel(self, request: gr.Request):
        return self.workspace_view(self._session(request, touch=False))

    def choose_listed(self, selected: gr.SelectData, request: gr.Request):
        """A row of the list clicked: that workspace chosen, for Open, Download or Delete. A list changed since it
        was drawn (another tab saved, renamed or deleted one) is drawn again, and nothing is chosen."""
        saved = self.registry.store.list(self._session(request, touch=False).owner)
        row = selected.index[0] if isinstance(selected.index, (list, tuple)) else selected.index
        shown = (selected.row_value or [""])[0]
        chosen = chosen_row(saved, row, shown)
        if chosen is None:
            messages.info("The list changed meanwhile: it is shown again; choose once more.")
            return gr.Dropdown(choices=workspace_choices(saved), value=None)
        return gr.Dropdown(choices=workspace_choices(saved), value=chosen)


IMPORTED = " (imported)"


def imported_name(saved: str) -> tuple[str, bool]:
    """The list's name of an imported workspace, and whether the name it was saved with had to be cut (a file
    can carry a name of millions of characters)."""
    name, cut = cut_name(saved, MAX_NAME_CHARS - len(IMPORTED))
    return name + IMPORTED, cut
