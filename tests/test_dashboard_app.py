"""`rlscale dashboard` without a browser: names render as text, the token gates every page, nothing outside the
page's own assets is served, serving pages never writes to the store, the page shows the fit of record, and a
refresh sends only what changed."""

import hashlib
import json
import time

import numpy as np
import pytest
from rlscale.db.store import Store
from rlscale.fitting.sigmoid import sigmoid
from starlette.testclient import TestClient

from rlscale.dashboard.app import create_app
from rlscale.dashboard.study import StudyView
from rlscale.views.page import StudyPage, render_study_page, script_json
from rlscale.views.page_charts import CURVE_POINTS, decimated, parallel_axes, study_axes

HOSTILE = "<img src=x onerror=alert(1)>"
CLOSER = "</script><script>alert(2)</script>"


def seed(url: str) -> None:
    """A grid study over lr with two runs, one named to attack the page, one still running on 2 GPUs."""
    with Store(url) as store:
        store.upsert_study(
            "grid",
            {"name": "grid", "method": "grid", "recipe": {"steps": 40}, "parameters": {"lr": {"values": [1e-4, 2e-4]}}},
        )
        for name, lr, status, error in ((HOSTILE, 1e-4, "stopped", CLOSER), ("lr2e-4", 2e-4, "running", "on 2 GPU")):
            run_id = store.ensure_run("grid", name, {"lr": lr, "steps": 40})
            hours = np.linspace(0.0, 0.4, 21)
            reward = sigmoid(hours, 0.5 + lr * 1000, 2.0, 0.1, 0.1)
            store.add_records(
                run_id,
                [
                    {"step": 2 * i, "gpu_hours": float(h), "val_reward": float(r)}
                    for i, (h, r) in enumerate(zip(hours, reward))
                ],
            )
            store.set_run_status(run_id, status, error=error)


@pytest.fixture
def url(tmp_path):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    seed(url)
    return url


def test_hostile_names_are_escaped_in_the_page_and_json_in_its_content_type(url):
    with TestClient(create_app(url)) as client:
        page = client.get("/study/grid")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert HOSTILE not in page.text and "&lt;img src=x onerror=alert(1)&gt;" in page.text
        assert CLOSER not in page.text  # the stop reason, shown as text
        data = client.get("/api/study/grid")
        assert data.headers["content-type"] == "application/json"
        payload = data.json()
        assert HOSTILE not in "".join(payload["sections"].values())
        first = str(payload["order"][0])
        assert payload["runs"][first]["run"] == HOSTILE  # data, put in the page with textContent
        index = client.get("/")
        assert index.status_code == 200 and 'href="study/grid"' in index.text


def test_embedded_chart_data_cannot_close_its_script_element():
    text = script_json({"run": CLOSER})
    assert "</script" not in text and json.loads(text) == {"run": CLOSER}
    page = render_study_page(StudyPage(study="s", runs=[{"id": 1, "run": CLOSER, "n": 0, "c": [], "r": []}]))
    assert page.count("</script>") == page.count("<script")  # each script element closed by its own tag only


def decided(client, study: str) -> dict:
    """The study's payload once its decision is worked out (the page says so meanwhile); polled, 60 s at most."""
    deadline = time.monotonic() + 60
    while (
        "working out the decision"
        in (payload := client.get(f"/api/study/{study}").json())["sections"]["decision"].lower()
    ):
        assert time.monotonic() < deadline, "the decision was not worked out"
        time.sleep(0.05)
    return payload


def test_a_refresh_sends_only_the_run_with_a_new_record(url):
    with TestClient(create_app(url)) as client:
        first = decided(client, "grid")  # the decision sets each run's reward at its budget: then nothing moves
        assert first["full"] and len(first["runs"]) == 2
        assert client.get("/api/study/grid", params={"since": first["stamp"]}).json() == {
            "changed": False,
            "stamp": first["stamp"],
        }
        with Store(url) as store:
            run_id = int(store.runs_frame("grid")["run_id"].iloc[1])
            store.add_records(run_id, [{"step": 42, "gpu_hours": 0.42, "val_reward": 0.7}])
        second = client.get("/api/study/grid", params={"since": first["stamp"]}).json()
        assert second["changed"] and second["stamp"] != first["stamp"] and not second["full"]
        assert list(second["runs"]) == [str(run_id)]  # the other run did not change: it is not sent again
        changed, before = second["runs"][str(run_id)], first["runs"][str(run_id)]
        assert changed["r"][-1] == 0.7 and changed["n"] == before["n"] + 1
        assert "order" not in second and "flight" not in second.get("sections", {})
        stale = client.get("/api/study/grid", params={"since": "an-earlier-server.3"}).json()
        assert stale["full"] and len(stale["runs"]) == 2  # a stamp this server did not give gets everything


def test_a_rebuild_that_changes_nothing_keeps_the_stamp(url):
    view = StudyView("grid")
    with Store(url, read_only=True) as store:
        view.refresh(store)
        deadline = time.monotonic() + 60
        while view._decided == 0:  # the decision's thread
            assert time.monotonic() < deadline, "the decision was not worked out"
            time.sleep(0.05)
        stamp, _ = view.refresh(store)  # the page with the decision
        # the decision's thread finishing while a build reads it: the count moves after the page already shows it
        view._decided += 1
        again, _ = view.refresh(store)
    assert again == stamp and view.changes(stamp) == {"stamp": stamp, "full": False}


def test_evaluations_arriving_without_a_status_change_are_decided_on_when_due(url, monkeypatch):
    import rlscale.dashboard.study as study

    def wait(count: int) -> None:
        deadline = time.monotonic() + 60
        while view._decided < count:  # the decision's thread
            assert time.monotonic() < deadline, "the decision was not worked out"
            time.sleep(0.05)

    view = StudyView("grid")
    with Store(url) as store:
        view.refresh(store)
        wait(1)
        before = view._decision[0][1]
        run_id = int(store.runs_frame("grid")["run_id"].iloc[1])
        store.add_records(run_id, [{"step": 42, "gpu_hours": 0.42, "val_reward": 0.7}])
        view.refresh(store)  # the same statuses, within DECIDE_EVERY_S: the page keeps its decision, due later
        assert view._decided == 1 and view._decide_due is not None
        monkeypatch.setattr(study, "DECIDE_EVERY_S", 0.0)
        view._decide_due = time.monotonic()
        view.refresh(store)  # due: worked out on every evaluation now
        wait(2)
    assert view._decision[0][1] == before + 1


def test_runs_in_flight_and_runs_stopped_early_are_shown_with_what_the_sweep_wrote(url):
    with Store(url) as store, TestClient(create_app(url)) as client:
        held = store.lock_study("grid")  # as the sweep driving them holds it
        try:
            payload = client.get("/api/study/grid").json()
        finally:
            held.release()  # as a driver killed with -9 lets go: the page says what its run marked running is
        left = client.get("/api/study/grid").json()["sections"]["flight"]
    sections = payload["sections"]
    assert "lr2e-4 (2 GPU)" in sections["flight"] and "1 in flight" in sections["flight"]
    assert "no sweep is running: 1 run(s) marked running were left by one that ended" in left and "lr2e-4" in left
    assert "&lt;/script&gt;" in sections["stopped"]
    assert [(row["status"], row["note"]) for row in payload["runs"].values()] == [
        ("stopped", CLOSER),
        ("running", "on 2 GPU"),
    ]


def test_the_page_shows_the_fit_of_record_and_refits_only_the_run_that_changed(url):
    from rlscale.fitting.stored import study_fits

    view = StudyView("grid")
    with Store(url, read_only=True) as store:
        _, page = view.refresh(store)
        of_record = study_fits(store, "grid").curves
        assert [row["A"] for row in page.runs] == pytest.approx(of_record["A"].tolist(), rel=1e-3)
        assert [row["identified"] for row in page.runs] == of_record["identified"].tolist()
        fitted = len(view.memo)
    with Store(url) as writer:
        run_id = int(writer.runs_frame("grid")["run_id"].iloc[1])
        writer.add_records(run_id, [{"step": 42, "gpu_hours": 0.42, "val_reward": 0.7}])
    with Store(url, read_only=True) as store:
        _, page = view.refresh(store)
    assert len(view.memo) == fitted + 1  # one new fit: the run with the new record
    assert view.records.reads == {"whole": 1, "added": 1}  # and only the new record was read


def test_a_run_sends_at_most_its_share_of_points_spread_over_log_compute():
    compute = np.linspace(0.001, 1.0, 1000)  # evaluations evenly spaced in compute: 90% of them in the last decade
    keep = decimated(compute)
    assert len(keep) <= CURVE_POINTS and keep[0] == 0 and keep[-1] == 999
    per_decade = np.histogram(np.log10(compute[keep]), bins=[-3, -2, -1, 0.01])[0]
    assert per_decade.min() >= 5  # spread over log compute, as the chart's axis is
    assert decimated(np.array([0.0, 0.1, 0.2])).tolist() == [1, 2]  # compute 0 has no place on a log axis


def test_the_parallel_axes_are_the_studys_then_the_fit():
    import pandas as pd

    runs = pd.DataFrame(
        {
            "run": ["a", "b", "c"],
            "seed": [0, 0, 0],
            "config": [{"lr": 1e-4, "loss": "cispo"}, {"lr": 3e-4, "loss": "dapo"}, {"lr": 1e-4, "source": "x"}],
        }
    )
    axes = study_axes(None, runs)  # imported without a spec: the keys the runs differ in
    assert axes == {"loss": ["cispo", "dapo", None], "lr": [1e-4, 3e-4, 1e-4]}
    rows = [{"A": 0.5, "B": 1.2, "at_budget": 0.4}, {"A": 0.7, "B": 2.0, "at_budget": None}, {"A": None}]
    drawn = parallel_axes(axes, rows, "fitted reward at 1 GPU-hours")
    assert [(a["key"], a["kind"], a["fitted"]) for a in drawn] == [
        ("loss", "ordinal", False),
        ("lr", "ordinal", False),
        ("A", "linear", True),
        ("B", "linear", True),
        ("at_budget", "linear", True),
    ]
    assert drawn[0]["values"] == ["cispo", "dapo"] and drawn[2]["lo"] < 0.5 and drawn[2]["hi"] > 0.7


@pytest.mark.parametrize(
    "path",
    [
        "/assets/../db/store.py",
        "/assets/..%2f..%2fdb%2fstore.py",
        "/assets/page.py",
        "/assets/%2e%2e/page.py",
        "/assets/",
        "/../../etc/passwd",
        "/study/..%2f..",
        "/api/study/..",
        "/study/%3Cimg%3E",
    ],
)
def test_nothing_outside_the_pages_own_assets_is_served(url, path):
    with TestClient(create_app(url)) as client:
        response = client.get(path)
    assert response.status_code == 404
    assert "import" not in response.text and "root:" not in response.text


def test_the_pages_assets_are_served_with_their_types_and_a_policy_that_allows_no_other_script(url):
    with TestClient(create_app(url)) as client:
        script = client.get("/assets/page.js")
        licence = client.get("/assets/uPlot.LICENSE")
        page = client.get("/study/grid")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert "MIT" in licence.text
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"


def test_with_a_token_every_page_needs_it_and_the_token_moves_into_a_cookie(url):
    with TestClient(create_app(url, token="s3cret"), follow_redirects=False) as client:
        assert client.get("/").status_code == 401
        assert client.get("/api/study/grid").status_code == 401
        assert client.get("/assets/page.js").status_code == 401
        assert client.get("/", params={"token": "wrong"}).status_code == 401
        entry = client.get("/study/grid", params={"token": "s3cret"})
        assert entry.status_code == 303 and entry.headers["location"] == "/study/grid"
        cookie = entry.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert client.get("/study/grid").status_code == 200  # the cookie
    with TestClient(create_app(url, token="s3cret")) as client:
        assert client.get("/api/study/grid", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_listening_beyond_loopback_without_a_token_refuses_to_start(cli):
    code, out, err = cli("dashboard", "--host", "0.0.0.0", "--port", "1")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "--token" in err


def test_serving_pages_never_writes_to_the_store(url, tmp_path):
    path = tmp_path / "store.db"
    with Store(url) as store:  # the writer checkpoints and closes: the file alone holds the store
        store.runs_frame("grid")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with TestClient(create_app(url)) as client:
        for route in ("/", "/study/grid", "/api/study/grid", "/study/nope", "/api/study/grid"):
            client.get(route)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    wal = tmp_path / "store.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0


def test_an_unknown_study_is_a_404_naming_the_known_ones(url):
    with TestClient(create_app(url)) as client:
        response = client.get("/study/nope")
        data = client.get("/api/study/nope")
    assert response.status_code == 404 and "no study named" in response.text and "grid" in response.text
    assert data.status_code == 404 and "no study named" in data.json()["error"]


def test_a_store_that_does_not_exist_yet_is_said_on_the_page_and_not_created(tmp_path):
    path = tmp_path / "later.db"
    with TestClient(create_app(f"sqlite:///{path}")) as client:
        response = client.get("/")
    assert response.status_code == 503 and "no store at" in response.text
    assert not path.exists()


@pytest.mark.parametrize(
    "url, message",
    [
        ("sqlit:///x.db", "cannot use sqlit:///x.db"),
        ("sqlite:///{tmp}/text.db", "is not a SQLite database"),
        ("sqlite://", "an in-memory store has nothing to read"),
        ("sqlite:///:memory:", "an in-memory store has nothing to read"),
    ],
)
def test_a_store_that_cannot_be_read_refuses_to_start_in_one_line(cli, tmp_path, url, message):
    (tmp_path / "text.db").write_text("not a database\n")
    code, out, err = cli("dashboard", "--db", url.format(tmp=tmp_path), "--port", "0")
    assert code == 2 and not out and len(err.strip().splitlines()) == 1 and message in err


def test_a_port_in_use_refuses_to_start_in_one_line(cli, url):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, out, err = cli("dashboard", "--db", url, "--port", str(port))
    assert (
        code == 2
        and not out
        and err.strip() == (f"error: --port: cannot listen on 127.0.0.1:{port}: Address already in use")
    )


def test_an_address_that_cannot_be_listened_on_names_the_host(cli, url):
    code, out, err = cli("dashboard", "--db", url, "--host", "nosuchhost.invalid", "--token", "t" * 32)
    assert code == 2 and not out and err.startswith("error: --host: cannot listen on nosuchhost.invalid:8765")
