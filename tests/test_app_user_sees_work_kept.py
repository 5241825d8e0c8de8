"""What a user sees (issue 32, items 1, 2 and the chat's escaping): New context keeps the work it leaves, Open
always answers, a workspace read back from disk says so while it is read, and the user's words show as typed.

In-process, on the demo model, with the events' own handler functions."""

from __future__ import annotations

from app_fixtures import make_long_text
from handler_fixtures import SETTINGS, drain, make_handlers, request, wait_until
from test_app_hostile_round2 import ask, toasts

from app.web.views import chat_messages


def chat_text(shown) -> str:
    return " ".join(str(m["content"]) for m in shown[1])


def named_workspace(runtime, tmp_path, tab: str, name: str, question: str = "What is this about?", files=None):
    """Handlers over ``tmp_path/ws``, and a tab whose workspace, called ``name``, read a file and answered."""
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req = request(tab)
    workspace_id = handlers.attach(None, req)[0]
    ask(handlers, req, question, [make_long_text(tmp_path / "notes.txt", 20)] if files is None else files)
    handlers.registry.peek(tab).name = name
    return handlers, req, workspace_id


def test_new_context_starts_a_new_workspace_and_keeps_the_one_it_leaves(runtime, tmp_path):
    handlers, req, first = named_workspace(runtime, tmp_path, "tab", "Notes")
    tokens = handlers.registry.peek("tab").context_tokens

    shown, said = toasts(lambda: handlers.new_context(req))
    assert shown[0] != first and handlers.registry.peek("tab").pristine  # a new, empty workspace in the tab
    assert said == ["“Notes” is kept in Workspaces, saved as you left it; this is a new, empty workspace."]
    assert [w.id for w in handlers.registry.store.list(None)] == [first]  # saved at once, not wiped
    assert [value for _, value in shown[13].constructor_args["choices"]] == [first]  # listed on the same screen
    saved = handlers.registry.store.list(None)[0]
    assert saved.name == "Notes" and saved.summary.tokens == tokens

    reopened, said = toasts(lambda: drain_open(handlers, first, req))
    assert reopened[-1][0] == first and handlers.registry.peek("tab").context_tokens == tokens
    assert "What is this about?" in chat_text(reopened[-1])

    # A pristine workspace left by New context is not worth a word, and nothing is saved for it.
    emptied = handlers.attach(None, request("other"))[0]
    shown, said = toasts(lambda: handlers.new_context(request("other")))
    assert shown[0] != emptied and said == []
    assert [w.id for w in handlers.registry.store.list(None)] == [first]


def drain_open(handlers, choice, req) -> list:
    """Every view the Open event sends, in order."""
    return list(handlers.open_workspace(choice, req))


def test_open_always_answers_and_a_reopen_shows_which_workspace_is_read_back(runtime, tmp_path):
    maker, req, workspace_id = named_workspace(runtime, tmp_path, "maker", "Release notes")
    maker.registry.save_now(maker.registry.peek("maker"))

    # Open on the workspace the tab already shows: it says so (it did nothing, with no message).
    views, said = toasts(lambda: drain_open(maker, workspace_id, req))
    assert len(views) == 1 and views[0][0] == workspace_id
    assert said == ["“Release notes” is the workspace open in this tab."]

    # Another server (a restart) reads it back on the page load: first a view naming it, then the workspace.
    restarted = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    views = list(restarted.page_load(workspace_id, request("reload")))
    assert len(views) == 2
    interim, final = views
    assert "Reopening “Release notes”" in interim[1][0]["metadata"]["title"]
    assert interim[1][0]["metadata"]["status"] == "pending" and "back into memory" in interim[1][0]["content"]
    assert "Reopening workspace" in interim[4] and interim[10] == "Release notes"
    assert final[0] == workspace_id and "What is this about?" in chat_text(final)

    # Live now: a second tab's page load shows it at once, with nothing in between.
    assert len(list(restarted.page_load(workspace_id, request("second tab")))) == 1


def test_a_workspace_that_cannot_be_reopened_is_named_by_its_name(runtime, tmp_path):
    maker, req, workspace_id = named_workspace(runtime, tmp_path, "maker", "Thesis", "Hello?", files=())
    maker.registry.save_now(maker.registry.peek("maker"))
    path = maker.registry.store.path(None, workspace_id)
    path.write_bytes(path.read_bytes()[:200])  # cut short: a crash mid-copy

    restarted = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    shown, said = toasts(lambda: restarted.attach(workspace_id, request("reload")))
    assert len(said) == 1 and said[0].startswith("“Thesis” could not be opened"), said
    assert workspace_id not in said[0]


def test_the_users_words_show_as_typed_in_the_chat(runtime, tmp_path):
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req = request("tab")
    handlers.attach(None, req)
    question = "Which <edit> mode replaces a*b*c values?\nSecond line"
    view = ask(handlers, req, question)
    shown = view[0][0]["content"]
    assert shown == r"Which &lt;edit&gt; mode replaces a\*b\*c values?  " + "\nSecond line"


def test_regenerate_answers_the_last_question_again_in_its_place_even_after_stop(runtime, tmp_path):
    """One rule (issue 32, item 6): after Stop it re-asked the question as a second turn below the stopped one,
    while after an answer it replaced the answer."""
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req = request("tab")
    handlers.attach(None, req)
    ask(handlers, req, "What is this about?", [make_long_text(tmp_path / "notes.txt", 20)])
    session = handlers.registry.peek("tab")
    handlers.submit({"text": "And then?", "files": []}, req)
    session.stop()  # stopped: the exchange stays visible, marked as not kept
    drain(handlers.run(*SETTINGS, req))
    kinds = [(c.kind, c.text if c.kind == "question" else c.in_context) for c in session.chat if c.kind != "status"]
    assert kinds == [("question", "What is this about?"), ("answer", True), ("question", "And then?"),
                     ("answer", False)]

    handlers.queue_regenerate(req)
    drain(handlers.run(*SETTINGS, req))
    after_stop = [(c.kind, c.text if c.kind == "question" else c.in_context) for c in session.chat
                  if c.kind != "status"]
    assert after_stop == [("question", "What is this about?"), ("answer", True), ("question", "And then?"),
                          ("answer", True)]  # in place: no second "And then?"

    handlers.queue_regenerate(req)
    drain(handlers.run(*SETTINGS, req))
    again = [(c.kind, c.text if c.kind == "question" else c.in_context) for c in session.chat if c.kind != "status"]
    assert again == after_stop and "regenerated with sampling" in views_of(session)[-1]["content"]


def views_of(session) -> list[dict]:
    return chat_messages(session.chat)


def test_an_archive_is_removed_as_a_whole_and_the_cost_is_stated_after_a_reopen(runtime, tmp_path):
    """Issue 32, item 7: a zipped repository was one row per file, removable only file by file; after a reopen
    the first click's message gave no time."""
    import zipfile

    archive = tmp_path / "proj.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for n in range(3):
            zf.writestr(f"proj/module_{n}.py", f"def handler_{n}(request):\n    return {n}\n" * 40)
    notes = make_long_text(tmp_path / "notes.txt", 10)
    handlers = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    req = request("tab")
    workspace_id = handlers.attach(None, req)[0]
    ask(handlers, req, "What does handler_1 return?", [archive, notes])
    session = handlers.registry.peek("tab")
    handlers.registry.save_now(session)

    reopened = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    other = request("reopened")
    reopened.attach(workspace_id, other)
    session = reopened.registry.peek("reopened")
    choices = reopened.removable(None, other).constructor_args["choices"]
    assert choices[0] == ("proj.zip (the whole archive, 3 files)", "proj.zip/")
    assert {value for _, value in choices[1:]} == {"proj.zip/proj/module_0.py", "proj.zip/proj/module_1.py",
                                                   "proj.zip/proj/module_2.py", "notes.txt"}
    before = session.context_tokens

    _, said = toasts(lambda: reopened.queue_remove("proj.zip/", other))  # the first click says what it costs
    assert len(said) == 1 and said[0].startswith("Removing proj.zip (3 files)")  # a toast, seen wherever one looks
    assert session.stop_note.startswith("Removing proj.zip (3 files) reads the rest of the context again: ")
    assert " tokens, about " in session.stop_note and "Click again" in session.stop_note
    reopened.queue_remove("proj.zip/", other)
    drain(reopened.run(*SETTINGS, other))
    assert [r.path for r in session.documents] == ["notes.txt"]
    assert 0 < session.context_tokens < before
    assert any(c.title == "Removed proj.zip (3 files)" for c in session.chat if c.kind == "status")


def test_answer_from_switches_a_document_off_and_on_and_the_workspace_keeps_it(runtime, tmp_path):
    """Item 11: a document switched off is not cited; the list shows it unchecked, after a reopen too."""
    from app_fixtures import make_long_text as long_text

    notes, other = long_text(tmp_path / "notes.txt", 20), tmp_path / "other.txt"
    other.write_text("\n".join(f"{i}. The harbour master keeps the tide tables of the bay." for i in range(20)))
    handlers, req, workspace_id = named_workspace(runtime, tmp_path, "tab", "Two files", files=[notes, other])
    session = handlers.registry.peek("tab")
    shown = handlers.show(req)[8]  # the "Answer from" list, after the chat's outputs
    assert [v for _, v in shown["choices"]] == ["notes.txt", "other.txt"] == shown["value"]

    question = "What colour is the grass, and the sky?"  # notes.txt's words
    ask(handlers, req, question, [])
    assert session.chat[-1].citations[0].where.source == "notes.txt"
    handlers.switch_documents(["other.txt"], req)
    assert session.answering_off() == {"notes.txt"} and handlers.show(req)[8]["value"] == ["other.txt"]
    ask(handlers, req, question, [])
    assert {c.where.source for c in session.chat[-1].citations} == {"other.txt"}

    handlers.registry.save_now(session)
    reopened = make_handlers(runtime, workspaces=str(tmp_path / "ws"))
    reopened.attach(workspace_id, request("later"))
    wait_until(lambda: reopened.registry.peek("later").context_tokens == session.context_tokens)
    assert reopened.registry.peek("later").answering_off() == {"notes.txt"}
    handlers.switch_documents(["notes.txt", "other.txt"], req)  # on again
    assert session.answering_off() == frozenset()
