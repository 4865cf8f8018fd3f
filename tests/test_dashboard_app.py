"""`rlscale dashboard` without a browser: names render as text, the token gates every page, nothing outside the
page's own assets is served, and serving pages never writes to the store."""

import hashlib
import json

import numpy as np
import pytest
from rlscale.db.store import Store
from rlscale.fitting.sigmoid import sigmoid
from starlette.testclient import TestClient

from rlscale.dashboard.app import create_app
from rlscale.views.page import StudyPage, render_study_page, script_json

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
        assert payload["charts"]["curves"]["runs"][0]["run"] == HOSTILE  # data, drawn by uPlot with textContent
        index = client.get("/")
        assert index.status_code == 200 and 'href="study/grid"' in index.text


def test_embedded_chart_data_cannot_close_its_script_element():
    text = script_json({"run": CLOSER})
    assert "</script" not in text and json.loads(text) == {"run": CLOSER}
    page = render_study_page(
        StudyPage(
            study="s",
            curves={
                "grid": [],
                "unit": "",
                "reward": "",
                "runs": [{"run": CLOSER, "c": [], "r": [], "fit": None, "color": 0}],
            },
        )
    )
    assert page.count("</script>") == page.count("<script")  # each script element closed by its own tag only


def test_a_refresh_without_changes_says_so_and_a_new_record_changes_it(url):
    with TestClient(create_app(url)) as client:
        first = client.get("/api/study/grid").json()
        assert client.get("/api/study/grid", params={"since": first["stamp"]}).json() == {
            "changed": False,
            "stamp": first["stamp"],
        }
        with Store(url) as store:
            run_id = int(store.runs_frame("grid")["run_id"].iloc[1])
            store.add_records(run_id, [{"step": 42, "gpu_hours": 0.42, "val_reward": 0.7}])
        second = client.get("/api/study/grid", params={"since": first["stamp"]}).json()
        assert second["changed"] and second["stamp"] != first["stamp"]
        assert second["charts"]["curves"]["runs"][1]["r"][-1] == 0.7


def test_runs_in_flight_and_runs_stopped_early_are_shown_with_what_the_sweep_wrote(url):
    with TestClient(create_app(url)) as client:
        sections = client.get("/api/study/grid").json()["sections"]
    assert "lr2e-4 (2 GPU)" in sections["flight"] and "1 in flight" in sections["flight"]
    assert 'class="status-stopped' in sections["runs"] and "&lt;/script&gt;" in sections["stopped"]


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
