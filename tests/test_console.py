"""``kip98 console`` in a real browser (Playwright driving Debian's chromium) against a
real ``kip98 console`` process over a fresh database: log-in with kip98's users, the
record browser in both isolations, a transaction's timeline, KIP-664's abort of a hanging
transaction, ACLs, CSRF and bad input.

Screenshots of each page are written to docs/console/ when KIP98_CONSOLE_SCREENSHOTS=1
(docs/console.md shows them), to the test's temporary directory otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import text

from app.admin import AdminClient, NewTopic
from app.broker import Broker
from app.client.consumer import Consumer
from app.console.templates import iso_ms
from app.groups.offsets import offset_commit
from app.protocol import OffsetAndMetadata, OffsetCommitRequest
from app.security import acls as acl_admin
from app.security.rules import AclBinding as Acl
from app.security.users import add_user
from app.server.process import free_port
from tests.helpers.cli_runner import KIP98_BIN
from tests.helpers.txn_driver import TxnDriver

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
KIP98 = [str(KIP98_BIN)]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not os.path.exists(CHROMIUM):
        pytest.fail("chromium is missing: scripts/setup installs it")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@dataclass
class World:
    url: str
    broker: Broker
    shots: Path


def _wait_for_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120  # a hang guard, not a speed expectation
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"kip98 console exited: {proc.stderr.read().decode() if proc.stderr else ''}"
            )
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("kip98 console did not listen")


@pytest.fixture
def console(db_url: str, tmp_path: Path) -> Iterator[World]:
    """The users (admin, the super user; alice, who may see topic t and its transactions,
    by SCRAM-SHA-512; bob, with no ACL), topics t and secret, and a console with
    authorization on."""
    broker = Broker.connect(db_url)
    add_user(broker, "admin", "admin-secret")
    add_user(broker, "alice", "alice-secret", "SCRAM-SHA-512")
    add_user(broker, "bob", "bob-secret")
    acl_admin.create_acls(
        broker,
        [Acl("User:alice", "topic", "t", "describe"),
         Acl("User:alice", "transactional_id", "*", "describe")],
    )  # fmt: skip
    with AdminClient({"database.url": db_url}) as admin:
        for fut in admin.create_topics([NewTopic("t", 1), NewTopic("secret", 1)]).values():
            fut.result()
    port = free_port()
    env = {**os.environ, "KIP98_DATABASE_URL": db_url, "KIP98_AUTHORIZATION": "1"}
    proc = subprocess.Popen(
        [*KIP98, "console", "--listen", f"127.0.0.1:{port}"],
        cwd=ROOT, env=env, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _wait_for_port(port, proc)
        shots = (
            ROOT / "docs" / "console" if os.environ.get("KIP98_CONSOLE_SCREENSHOTS") else tmp_path
        )
        shots.mkdir(exist_ok=True)
        yield World(f"http://127.0.0.1:{port}", broker, shots)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _log_in(browser: object, world: World, user: str, password: str) -> object:
    page = browser.new_context().new_page()  # type: ignore[attr-defined]
    page.goto(world.url + "/topics")
    expect(page).to_have_url(world.url + "/login?next=/topics")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    expect(page).to_have_url(world.url + "/topics")
    return page


def test_browse_timeline_and_abort(browser: object, console: World) -> None:
    broker = console.broker
    committed = TxnDriver(broker, "tx-commit")
    committed.init()
    committed.send("t", 0, "c1", "c2")
    committed.end(commit=True)
    aborted = TxnDriver(broker, "tx-abort")
    aborted.init()
    aborted.send("t", 0, "a1")
    aborted.end(commit=False)
    running = TxnDriver(broker, "tx-open")  # a producer mid-transaction
    running.init()
    running.send("t", 0, "o1")

    page = _log_in(browser, console, "admin", "admin-secret")
    expect(page.locator("#topics")).to_contain_text("secret")
    # The log's size on disk (all topics together), and each topic's and partition's
    # estimated share of it (by the offsets each spans: t has all of them so far).
    size = re.compile(r"all topics together: \d+(\.\d)? (bytes|KiB|MiB|GiB|TiB)")
    expect(page.locator("#log-size")).to_have_text(size)
    estimate = re.compile(r"^≈ \d+(\.\d)? (bytes|KiB|MiB|GiB|TiB)$")
    expect(page.locator("#topics tr", has_text="secret").locator("td.size")).to_have_text(
        "≈ 0 bytes"
    )
    expect(page.locator("#topics tr", has_text="t").locator("td.size").first).to_have_text(estimate)
    listed = page.context.request.get(console.url + "/api/topics").json()
    sizes = {t["topic"]: t["estimated_bytes"] for t in listed["topics"]}
    assert listed["log_bytes"] > 0 and sizes == {"secret": 0, "t": listed["log_bytes"]}
    page.screenshot(path=str(console.shots / "topics.png"), full_page=True)

    page.goto(console.url + "/topics/t?isolation=read_uncommitted")
    expect(page.locator("#log-size")).to_have_text(size)
    expect(page.locator("#partitions td.size")).to_have_text(estimate)
    expect(page.locator("#topic-size")).to_contain_text("an estimate")
    topic_api = page.context.request.get(console.url + "/api/topics/t").json()
    assert topic_api["partitions"][0]["estimated_bytes"] == topic_api["estimated_bytes"] > 0
    rows = page.locator("#records tr[data-offset]")
    # c1 c2 COMMIT a1 ABORT o1
    expect(rows).to_have_count(6)
    expect(rows.locator(".status")).to_have_text(
        ["committed", "committed", "marker COMMIT", "aborted", "marker ABORT", "open"]
    )
    expect(rows.first.locator("td.time")).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d .*\.\d{3}Z$"))
    page.screenshot(path=str(console.shots / "records.png"), full_page=True)
    page.select_option("#isolation", "read_committed")
    page.click("#browse button")
    expect(page.locator("#records tr[data-offset] .status")).to_have_text(
        ["committed", "committed", "marker COMMIT", "marker ABORT"]
    )
    page.goto(console.url + "/topics/t?isolation=read_uncommitted&offset=3&limit=2")
    expect(page.locator("#records tr[data-offset]")).to_have_count(2)
    expect(page.locator("#records tr[data-offset]").first).to_have_attribute("data-offset", "3")

    # The timeline follows the transaction through its commit, then an abort.
    page.goto(console.url + "/transactions/tx-commit")
    expect(page.locator("#state")).to_have_text("COMPLETE_COMMIT")
    expect(page.locator("#markers")).to_contain_text("COMMIT")
    committed.send("t", 0, "c3")
    committed.end(commit=False)
    page.reload()
    expect(page.locator("#state")).to_have_text("COMPLETE_ABORT")
    states = page.locator("#events .state")
    expect(states.last).to_have_text("COMPLETE_ABORT")
    expect(page.locator("#events")).to_contain_text("PREPARE_COMMIT")
    expect(page.locator("#events")).to_contain_text("t-0")
    expect(page.locator("#markers tr")).to_have_count(3)  # header, COMMIT, ABORT
    # Drawn above the table: a segment per event coloured by its outcome, a lane for t-0
    # with its two markers; times are ISO-8601 UTC with milliseconds.
    timeline = page.locator("svg#timeline")
    expect(timeline).to_be_visible()
    expect(timeline.locator("rect.segment[data-state='PREPARE_COMMIT']")).to_have_count(1)
    expect(timeline.locator("rect.segment[data-state='COMPLETE_ABORT']")).to_have_attribute(
        "data-outcome", "abort"
    )
    expect(timeline.locator("[data-partition='t-0'] line.marker")).to_have_count(2)
    iso = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z$")
    for cell in page.locator("#events td.time, #markers td.time").all():
        expect(cell).to_have_text(iso)
    page.screenshot(path=str(console.shots / "transaction.png"), full_page=True)

    # A hanging transaction (past its timeout, no coordinator running) is found and
    # aborted behind a confirmation.
    with broker.engine.begin() as conn:
        conn.execute(
            text("UPDATE transactions SET txn_start_ms = txn_start_ms - 700000 "
                 "WHERE transactional_id = 'tx-open'")
        )  # fmt: skip
    page.goto(console.url + "/transactions")
    hanging = page.locator("#hanging tr", has_text="t-0")
    expect(hanging).to_have_count(1)
    page.screenshot(path=str(console.shots / "transactions.png"), full_page=True)
    page.once("dialog", lambda d: d.accept())
    hanging.locator("button.abort").click()
    expect(page.locator("#message")).to_contain_text("Aborted the transaction at offset 5 of t-0")
    expect(page.locator("#hanging tr", has_text="t-0")).to_have_count(0)
    page.goto(console.url + "/topics/t?isolation=read_uncommitted&offset=5")
    expect(page.locator("#records tr[data-offset='5'] .status")).to_have_text("aborted")

    # Jump to a time: the first record at or after it.
    page.goto(console.url + "/topics/t?isolation=read_uncommitted&timestamp=0")
    expect(page.locator("#records tr[data-offset]").first).to_have_attribute("data-offset", "0")
    page.goto(console.url + "/topics/t?isolation=read_uncommitted&timestamp=99999999999999")
    expect(page.locator("#records tr[data-offset]")).to_have_count(0)
    # ... or an ISO-8601 time, as the pages show them: offset 3's time finds the first
    # record stamped at or after it. A page links to the next and the previous.
    stored = page.context.request.get(
        console.url + "/api/topics/t?isolation=read_uncommitted&offset=0"
    ).json()["records"]
    at = next(r["timestamp"] for r in stored if r["offset"] == 3)
    first = min(r["offset"] for r in stored if r["timestamp"] >= at)
    page.goto(console.url + "/topics/t?isolation=read_uncommitted&limit=2")
    page.fill("input[name=timestamp]", iso_ms(at))
    page.click("#browse button")
    shown = page.locator("#records tr[data-offset]").first
    expect(shown).to_have_attribute("data-offset", str(first))
    page.goto(console.url + "/topics/t?isolation=read_uncommitted&offset=2&limit=2")
    page.click("#next")
    expect(shown).to_have_attribute("data-offset", "4")
    page.click("#previous")
    page.click("#previous")
    expect(shown).to_have_attribute("data-offset", "0")
    expect(page.locator("#previous")).to_have_count(0)  # at the log start

    # A group's committed offset, its lag to the LSO and to the high watermark.
    committed_at = offset_commit(broker, OffsetCommitRequest("g", {("t", 0): OffsetAndMetadata(1)}))
    assert committed_at.error_code == 0
    page.goto(console.url + "/groups")
    page.click("#groups a:text-is('g')")
    expect(page.locator("#offsets tr", has_text="t-0").locator("td")).to_have_text(
        ["t-0", "1", "9", "9", "8", "8"]
    )
    # A member of a running group with its assignment.
    with Consumer(
        {"database.url": broker.engine.url.render_as_string(hide_password=False),
         "group.id": "readers", "client.id": "reader-1"}
    ) as reader:  # fmt: skip
        reader.subscribe(["t"])
        deadline = time.monotonic() + 120  # a hang guard
        while not reader.assignment() and time.monotonic() < deadline:
            reader.poll(0.5)
        assert reader.assignment()
        page.goto(console.url + "/groups/readers")
        expect(
            page.locator("#members tr", has_text="reader-1").locator("td.assignment")
        ).to_have_text("t-0")
    page.goto(console.url + "/groups/g")
    page.screenshot(path=str(console.shots / "group.png"), full_page=True)

    # The overview: the oldest open transaction's age (its start on hover), and the
    # charts read from the tables: t-0's LSO lag behind the open transaction, the commits.
    page.goto(console.url + "/")
    expect(page.locator("#oldest-open")).to_have_text(re.compile(r"^open for \d+ (ms|s|min|h|d)"))
    expect(page.locator("#oldest-open span")).to_have_attribute(
        "title", re.compile(r"^begun \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z$")
    )
    # pygal's charts, inline and without script: 3 rates and t-0's LSO lag, each titled.
    expect(page.locator("#charts figure.chart svg.pygal-chart")).to_have_count(4)
    expect(page.locator("#charts script, #lso-lag script")).to_have_count(0)
    commits = page.locator("#commit-rate svg")
    expect(commits.locator("> title")).to_have_text("Commit rate")
    expect(commits.locator("> desc")).to_contain_text("commits/s")
    expect(commits.locator(".series path.line")).to_have_attribute("d", re.compile(r" L\d"))
    expect(page.locator("#charts figcaption", has_text="LSO lag of t-0")).to_have_count(1)
    expect(page.locator("#lso-lag svg > title")).to_have_text("LSO lag now")
    lagging = page.context.request.get(console.url + "/api").json()["lso_lag"]
    assert lagging  # one bar per partition, its lag printed on it
    expect(page.locator("#lso-lag svg .series rect.rect")).to_have_count(len(lagging))
    expect(page.locator("#lso-lag svg > desc")).to_contain_text(
        f"{lagging[0]['topic']}-{lagging[0]['partition']}: {lagging[0]['lag']}"
    )
    for path, name in (("/", "overview"), ("/producers", "producers"), ("/groups", "groups")):
        page.goto(console.url + path)
        expect(page.locator("h1")).to_be_visible()
        page.screenshot(path=str(console.shots / f"{name}.png"), full_page=True)
    page.goto(console.url + "/producers")
    expect(page.locator("#producers td.time").first).to_have_text(re.compile(r"\.\d{3}Z$"))

    # A second instance of a transactional id fences the first mid-transaction: the
    # fence shows in the id's epochs, with its reason, and as a tick on the timeline; the
    # producers page links the producer id to that page.
    first = TxnDriver(broker, "tx-fenced")
    first.init()
    first.send("t", 0, "f1")
    TxnDriver(broker, "tx-fenced").init()
    page.goto(console.url + "/producers")
    page.click("#producers a:text-is('tx-fenced')")
    expect(page).to_have_url(console.url + "/transactions/tx-fenced")
    fence = page.locator("#epochs tr.fence")
    expect(fence).to_have_count(1)
    expect(fence.locator(".reason")).to_have_text("InitProducerId: fenced the previous instance")
    expect(fence.locator("td.time")).to_have_text(iso)
    expect(page.locator("#epochs .kind")).to_have_text(["new producer id", "fence", "epoch bump"])
    expect(page.locator("svg#timeline line.fence")).to_have_count(1)
    expect(page.locator("svg#timeline line.bump")).to_have_count(1)
    page.screenshot(path=str(console.shots / "fence.png"), full_page=True)

    # Kafka's DeleteRecords, behind a confirmation: the log of t-0 starts at offset 2.
    page.goto(console.url + "/topics/t")
    form = page.locator("#partitions form.delete-records")
    form.locator("input[name=before_offset]").fill("2")
    page.once("dialog", lambda d: d.accept())
    form.locator("button").click()
    expect(page.locator("#message")).to_have_text("The log of t-0 starts at offset 2.")
    expect(page.locator("#partitions tr", has_text="≈").locator("td").nth(1)).to_have_text("2")

    api = page.context.request
    history = api.get(console.url + "/api/transactions/tx-commit").json()
    assert history["events"][-1]["state"] == "COMPLETE_ABORT"
    assert isinstance(history["events"][-1]["updated_ms"], int)  # the JSON keeps milliseconds
    assert isinstance(history["markers"][0]["timestamp"], int)


def test_acls_csrf_and_bad_input(browser: object, console: World) -> None:
    stuck = TxnDriver(console.broker, "stuck", timeout_ms=600_000)
    stuck.init()
    stuck.send("secret", 0, "s")
    with console.broker.engine.begin() as conn:
        conn.execute(text("UPDATE transactions SET txn_start_ms = txn_start_ms - 700000"))

    # Not logged in: pages send to /login, the API answers 401.
    anonymous = browser.new_context().request  # type: ignore[attr-defined]
    assert anonymous.get(console.url + "/api/topics").status == 401
    wrong = anonymous.post(console.url + "/login", form={"username": "bob", "password": "nope"})
    assert wrong.status == 401

    # alice (SCRAM-SHA-512) sees t, not secret; the hanging transaction on secret is not shown.
    alice = _log_in(browser, console, "alice", "alice-secret")
    expect(alice.locator("#topics")).to_contain_text("t")
    expect(alice.locator("#topics")).not_to_contain_text("secret")
    expect(alice.locator("#log-size")).to_have_count(0)  # it sums topics she may not see
    assert alice.context.request.get(console.url + "/api/topics/secret").status == 403
    alice.goto(console.url + "/transactions")
    expect(alice.locator("#hanging")).to_contain_text("none")
    # She may not delete t's records (no Delete ACL): no form, and a POST is refused.
    alice.goto(console.url + "/topics/t")
    expect(alice.locator("form.delete-records")).to_have_count(0)
    alice_csrf = alice.locator("input[name=csrf_token]").first.get_attribute("value")
    r = alice.context.request.post(
        console.url + "/topics/delete-records",
        form={"topic": "t", "partition": "0", "before_offset": "0", "csrf_token": alice_csrf},
    )
    assert r.status == 403 and "not authorized to Delete" in r.text()
    # ... and, without Describe on the cluster, neither the nodes nor the cluster's charts.
    overview = alice.context.request.get(console.url + "/api").json()
    assert (overview["cluster"], overview["nodes"], overview["series"]) == (False, [], {})
    assert overview["topics"] == 1

    # bob sees no topic and no abort; a forged POST is refused.
    bob = _log_in(browser, console, "bob", "bob-secret")
    expect(bob.locator("#topics tr")).to_have_count(1)
    csrf = bob.locator("input[name=csrf_token]").first.get_attribute("value")
    form = {"topic": "secret", "partition": "0", "start_offset": "0"}
    r = bob.context.request.post(
        console.url + "/transactions/abort", form={**form, "csrf_token": csrf}
    )
    assert r.status == 403

    # The admin's own session, without the token or with another's: refused, nothing aborted.
    admin = _log_in(browser, console, "admin", "admin-secret")
    for token in ({}, {"csrf_token": "forged"}, {"csrf_token": csrf}):
        r = admin.context.request.post(console.url + "/transactions/abort", form={**form, **token})
        assert r.status == 403
        assert "CSRF" in r.text()
    admin.goto(console.url + "/transactions")
    expect(admin.locator("#hanging")).to_contain_text("secret-0")

    # Bad input: an error page, never a traceback.
    for query, status, words in (
        ("/topics/t?offset=abc", 400, "offset must be a whole number"),
        ("/topics/t?timestamp=yesterday", 400, "or an ISO-8601 time"),
        ("/topics/t?limit=100000000", 400, "limit must be between 1 and 1000"),
        ("/topics/t?isolation=dirty", 400, "isolation must be one of"),
        ("/topics/t?partition=7", 404, "no partition 7"),
        ("/topics/nope", 404, "no topic"),
        ("/transactions/nope", 404, "no transactional id"),
        ("/groups/nope", 404, "no group"),
    ):
        r = admin.context.request.get(console.url + query)
        assert r.status == status, query
        assert words in r.text() and "Traceback" not in r.text(), query
    admin.goto(console.url + "/topics/t?offset=abc")
    expect(admin.locator("#error")).to_contain_text("offset must be a whole number")


def test_read_only_turns_actions_off(browser: object, db_url: str) -> None:
    broker = Broker.connect(db_url)
    add_user(broker, "admin", "admin-secret")
    with AdminClient({"database.url": db_url}) as admin:
        admin.create_topics([NewTopic("t", 1)])["t"].result()
    stuck = TxnDriver(broker, "stuck", timeout_ms=600_000)
    stuck.init()
    stuck.send("t", 0, "s")
    with broker.engine.begin() as conn:
        conn.execute(text("UPDATE transactions SET txn_start_ms = txn_start_ms - 700000"))
    port = free_port()
    proc = subprocess.Popen(
        [*KIP98, "console", "--listen", f"127.0.0.1:{port}", "--read-only"],
        cwd=ROOT, env={**os.environ, "KIP98_DATABASE_URL": db_url}, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _wait_for_port(port, proc)
        world = World(f"http://127.0.0.1:{port}", broker, Path())
        page = _log_in(browser, world, "admin", "admin-secret")
        page.goto(world.url + "/transactions")
        expect(page.locator("#hanging")).to_contain_text("t-0")
        expect(page.locator("button.abort")).to_have_count(0)
        csrf = page.locator("input[name=csrf_token]").first.get_attribute("value")
        r = page.context.request.post(
            world.url + "/transactions/abort",
            form={"topic": "t", "partition": "0", "start_offset": "0", "csrf_token": csrf},
        )
        assert r.status == 403 and "read-only" in r.text()
        page.goto(world.url + "/topics/t")
        expect(page.locator("form.delete-records")).to_have_count(0)
        r = page.context.request.post(
            world.url + "/topics/delete-records",
            form={"topic": "t", "partition": "0", "before_offset": "0", "csrf_token": csrf},
        )
        assert r.status == 403 and "read-only" in r.text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_tls_serves_https_with_a_secure_cookie(
    browser: object, db_url: str, tmp_path: Path
) -> None:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    add_user(Broker.connect(db_url), "admin", "admin-secret")
    port = free_port()
    proc = subprocess.Popen(
        [*KIP98, "console", "--listen", f"127.0.0.1:{port}",
         "--tls-cert", str(cert_file), "--tls-key", str(key_file)],
        cwd=ROOT, env={**os.environ, "KIP98_DATABASE_URL": db_url}, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _wait_for_port(port, proc)
        api = browser.new_context(ignore_https_errors=True).request  # type: ignore[attr-defined]
        r = api.post(
            f"https://127.0.0.1:{port}/login",
            form={"username": "admin", "password": "admin-secret"},
            max_redirects=0,
        )
        assert r.status == 303
        cookie = next(h["value"] for h in r.headers_array if h["name"].lower() == "set-cookie")
        assert "kip98_console=" in cookie and "secure" in cookie.lower()
        assert "samesite=strict" in cookie.lower() and "httponly" in cookie.lower()
        assert api.get(f"https://127.0.0.1:{port}/api/topics").json()["topics"] == []
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    only_one = subprocess.run(
        [*KIP98, "console", "--tls-cert", str(cert_file)], capture_output=True, text=True
    )
    assert only_one.returncode != 0 and "go together" in only_one.stderr


def _start_console(db_url: str, *args: str, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [*KIP98, "console", "--listen", f"127.0.0.1:{port}", *args],
        cwd=ROOT, env={**os.environ, "KIP98_DATABASE_URL": db_url, **env},
        stderr=subprocess.PIPE,
    )  # fmt: skip
    _wait_for_port(port, proc)
    return proc, f"http://127.0.0.1:{port}"


def _stop(proc: subprocess.Popen[bytes]) -> str:
    proc.terminate()
    _out, err = proc.communicate(timeout=30)
    return err.decode()


def test_sessions_outlive_a_restart_and_are_shared_by_consoles_of_one_key(
    browser: object, db_url: str
) -> None:
    """Signed with KIP98_CONSOLE_SECRET (or KIP98_HOME/console-secret, its unit test in
    test_console_login.py): a restarted console, or a second one, knows the session. The
    charts of a console just started show the commits made before it (read from tables)."""
    broker = Broker.connect(db_url)
    add_user(broker, "admin", "admin-secret")
    with AdminClient({"database.url": db_url}) as admin:
        admin.create_topics([NewTopic("t", 1)])["t"].result()
    d = TxnDriver(broker, "before")
    d.init()
    d.send("t", 0, "x")
    d.end(commit=True)
    secret = {"KIP98_CONSOLE_SECRET": "s" * 48}
    first, url = _start_console(db_url, **secret)
    try:
        world = World(url, broker, Path())
        page = _log_in(browser, world, "admin", "admin-secret")
        series = page.context.request.get(url + "/api").json()["series"]
        assert sum(v for _t, v in series["commit_rate"]) > 0
    finally:
        _stop(first)
    again, url_again = _start_console(db_url, **secret)
    other, url_other = _start_console(db_url, **secret)
    stranger, url_stranger = _start_console(db_url, **{"KIP98_CONSOLE_SECRET": "o" * 48})
    try:
        for there in (url_again, url_other):  # a cookie of 127.0.0.1 goes to every port
            page.goto(there + "/topics")  # type: ignore[attr-defined]
            expect(page).to_have_url(there + "/topics")
            expect(page.locator("#topics")).to_contain_text("t")  # type: ignore[attr-defined]
        # A console with another key does not take the cookie.
        page.goto(url_stranger + "/topics")  # type: ignore[attr-defined]
        expect(page).to_have_url(url_stranger + "/login?next=/topics")
    finally:
        for proc in (again, other, stranger):
            _stop(proc)


def test_repeated_failed_log_ins_are_locked_out_and_logged(db_url: str, browser: object) -> None:
    add_user(Broker.connect(db_url), "admin", "admin-secret")
    proc, url = _start_console(db_url)
    try:
        api = browser.new_context().request  # type: ignore[attr-defined]
        for _ in range(5):
            r = api.post(url + "/login", form={"username": "admin", "password": "guess"})
            assert r.status == 401
        # Locked out: even the right password is not checked.
        r = api.post(url + "/login", form={"username": "admin", "password": "admin-secret"},
                     max_redirects=0)  # fmt: skip
        assert r.status == 429 and "Too many failed log-ins" in r.text()
        assert 0 < int(r.headers["retry-after"]) <= 300
    finally:
        log = _stop(proc)
    assert "console log-in failed: user 'admin' from 127.0.0.1:" in log
    assert "console log-in locked for 300 s: user 'admin' after 5 failures" in log
    assert "guess" not in log and "admin-secret" not in log
    assert log.count("console log-in failed") == 1  # the rest counted, one line
    assert "more console log-in failures from 127.0.0.1" in log
