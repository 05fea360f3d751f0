"""The plugin's resumed-request features (issue 47 item 1), without vLLM: a stand-in for vllm-rbln's optimum runner.

vllm-rbln 0.11.1a1's ``RBLNOptimumModelRunner._extract_mm_kwargs`` reads the features of new requests only, so a
request recomputed after a preemption (a cached request, ``resumed_req_ids``) gets no pixels and no grid. The engine
test (tests/test_engine_preempt.py) runs the real thing; these pin the wrapper's contract (the resumed request's
own features, from the runner's own per-request state, and nothing else changes), when ``qvl serve`` switches it on,
and what serve and deploy say about it.
"""

from __future__ import annotations

import json
import sys
import types
from types import SimpleNamespace as NS

import pytest

from qwenvl_rbln.serving import resume_features as rf
from tests.fakes_rbln import rbln_config_json, run_main, write_artifact


class Runner:
    """vllm-rbln's method as it reads its input (``optimum_model_runner.py:545-557``): new requests' features only,
    those with data, grouped by modality; ``requests`` is the runner's per-request state (``CachedRequestState``)."""

    def __init__(self) -> None:
        self.requests: dict[str, NS] = {}
        self.seen: list[object] = []

    def _extract_mm_kwargs(self, scheduler_output):
        self.seen.append(scheduler_output)
        out: dict[str, list] = {}
        if not scheduler_output:
            return out
        for req in scheduler_output.scheduled_new_reqs:
            for feature in req.mm_features:
                if feature.data is not None:
                    out.setdefault(feature.modality, []).append(feature.data)
        return out


def feature(modality: str, data: str) -> NS:
    return NS(modality=modality, data=data)


def step(new: list | None = None, cached: list[str] = (), resumed: list[str] = ()) -> NS:
    """A scheduler output: new requests (``NewRequestData``), cached ones and which of those were resumed."""
    data = NS(req_ids=list(cached), num_reqs=len(cached), resumed_req_ids=set(resumed))
    return NS(scheduled_new_reqs=new or [], scheduled_cached_reqs=data)


@pytest.fixture
def runner():
    cls = type("Runner", (Runner,), {"_extract_mm_kwargs": rf.with_resumed_features(Runner._extract_mm_kwargs)})
    runner = cls()
    # what vllm-rbln's _update_states stores from NewRequestData when a request is first scheduled
    runner.requests["img"] = NS(mm_features=[feature("image", "PIXELS+GRID-1"), feature("image", "PIXELS+GRID-2")])
    runner.requests["vid"] = NS(mm_features=[feature("video", "FRAMES+GRID")])
    runner.requests["txt"] = NS(mm_features=[])
    return runner


def test_a_resumed_request_gets_the_features_the_runner_kept_for_it(runner):
    resumed = step(cached=["img"], resumed=["img"])
    assert runner._extract_mm_kwargs(resumed) == {"image": ["PIXELS+GRID-1", "PIXELS+GRID-2"]}
    first, second = runner.seen  # vllm-rbln's own answer ({}), then the kept state as the step's new request
    assert first is resumed and second.scheduled_new_reqs == [runner.requests["img"]]
    assert second.scheduled_cached_reqs is resumed.scheduled_cached_reqs  # everything else is the step's own
    assert runner._extract_mm_kwargs(step(cached=["vid"], resumed=["vid"])) == {"video": ["FRAMES+GRID"]}


def test_every_other_step_is_vllm_rblns_own(runner):
    new = step(new=[NS(mm_features=[feature("image", "NEW")])])
    for output in (
        new,  # a new request: its own features, as vllm-rbln reads them
        step(cached=["img", "vid"]),  # a decode step
        step(cached=["img"]),  # one request decoding, not resumed
        step(cached=["txt"], resumed=["txt"]),  # a resumed text request: nothing to give
        step(cached=["gone"], resumed=["gone"]),  # a request the runner no longer knows (finished, aborted)
        None,
    ):
        runner.seen.clear()
        runner._extract_mm_kwargs(output)
        assert runner.seen == [output]
    assert runner._extract_mm_kwargs(new) == {"image": ["NEW"]}


def test_a_vllm_rbln_that_already_resumes_features_gets_none_twice(runner):
    """A later vllm-rbln that reads the resumed request's features itself: its answer stands, nothing is added."""
    fixed = type(runner)
    original = Runner._extract_mm_kwargs

    def reads_resumed_too(self, scheduler_output):
        out = original(self, scheduler_output)
        for req_id in scheduler_output.scheduled_cached_reqs.resumed_req_ids:
            for f in self.requests[req_id].mm_features:
                out.setdefault(f.modality, []).append(f.data)
        return out

    fixed._extract_mm_kwargs = rf.with_resumed_features(reads_resumed_too)
    resumed = step(cached=["img"], resumed=["img"])
    assert runner._extract_mm_kwargs(resumed) == {"image": ["PIXELS+GRID-1", "PIXELS+GRID-2"]}
    assert runner.seen == [resumed]


def test_the_features_go_when_the_runner_forgets_the_request(runner):
    """No cache of qvl's own: vllm-rbln pops ``requests[req_id]`` for every finished or aborted id, and after that a
    resumed step of that id (which vLLM never sends) gets nothing from qvl."""
    del runner.requests["img"]
    assert runner._extract_mm_kwargs(step(cached=["img"], resumed=["img"])) == {}


def test_install_wraps_vllm_rblns_method_once_and_only_when_asked(monkeypatch):
    module = types.ModuleType(rf.TARGET_MODULE)
    cls = type(rf.TARGET_CLASS, (Runner,), {"_extract_mm_kwargs": Runner._extract_mm_kwargs})
    module.__dict__[rf.TARGET_CLASS] = cls
    monkeypatch.setitem(sys.modules, rf.TARGET_MODULE, module)
    said: list[str] = []
    monkeypatch.delenv(rf.RESUME_ENV, raising=False)
    assert rf.install(said.append) is False and cls._extract_mm_kwargs is Runner._extract_mm_kwargs
    monkeypatch.setenv(rf.RESUME_ENV, "1")
    assert rf.install(said.append) and rf.install(said.append)  # vLLM may register twice
    wrapped = cls._extract_mm_kwargs
    assert getattr(wrapped, rf.MARK) and wrapped.__wrapped__ is Runner._extract_mm_kwargs and not said


def test_a_vllm_rbln_without_the_method_gets_one_warning_naming_the_risk(monkeypatch):
    monkeypatch.setitem(sys.modules, rf.TARGET_MODULE, None)  # not importable
    monkeypatch.setenv(rf.RESUME_ENV, "1")
    said: list[str] = []
    assert rf.install(said.append) is False
    (line,) = said
    assert rf.RESUME_ENV in line and "preempted image" in line and "ends the engine" in line


@pytest.mark.parametrize(
    ("blocks", "batch", "preempts"),
    [
        (9, 2, False),  # the full pool: 2 x 4 blocks (vllm-rbln adds the null block)
        (8, 2, False),  # exactly full
        (7, 2, True),
        (5, 2, True),  # the engine test's pool: 4 usable, 2 prompts of 2 blocks
        (0, 2, False),  # automatic: not resolved yet, a full pool
        (4, 1, False),  # batch 1: one row at max_seq_len, nothing to preempt
    ],
)
def test_which_pools_can_preempt(blocks, batch, preempts):
    cfg = {"kvcache_num_blocks": blocks, "kvcache_block_size": 1024, "max_seq_len": 4096, "batch_size": batch}
    assert rf.can_preempt(cfg) is preempts


def short_pool(tmp_path, blocks: int | None):
    from qwenvl_rbln.artifacts.manifest import write_manifest
    from qwenvl_rbln.planning.plan import build_plan

    plan = build_plan("rebel100-1npu", ["rbln_config.batch_size=2", "rbln_config.decoder_batch_sizes=[2,1]"])
    root = write_artifact(tmp_path / f"art-{blocks}", plan, cfg=rbln_config_json(plan, kv_blocks=blocks))
    write_manifest(root, {"format": 1, "npu": plan.npu, "placement": plan.placement, "model": {"id": "m"}})
    return root


def test_serve_switches_it_on_for_a_pool_that_can_preempt_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("os.execvpe", lambda *a, **k: pytest.fail("exec attempted"))
    code, out, err = run_main(["serve", str(short_pool(tmp_path, 40)), "--dry-run", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["env"][rf.RESUME_ENV] == "1"
    checks = {c["check"]: c for c in data["checks"]}
    line = checks["preemption"]["detail"]
    assert checks["preemption"]["ok"] and "KV pool (40 blocks)" in line and "batch_size 2 x 32 blocks (64)" in line
    assert "dies" in line and "pixels and grid again" in line and "ViT runs again" in line
    assert "preempts a request" in checks["kv pool"]["detail"]
    code, out, err = run_main(["serve", str(short_pool(tmp_path, None)), "--dry-run", "--json"], capsys)
    data = json.loads(out)  # the full pool (64 blocks): nothing preempts, nothing set, nothing said
    assert code == 0 and rf.RESUME_ENV not in data["env"]
    assert "preemption" not in {c["check"] for c in data["checks"]}


def test_deploy_without_the_plugin_names_the_crash_a_short_pool_risks(tmp_path):
    from qwenvl_rbln.deploy.build import build
    from qwenvl_rbln.deploy.options import DeployOptions

    def pod(plugin: bool):
        opts = DeployOptions(
            directory=short_pool(tmp_path, 40), artifact="pvc:models", image="r/v:1", dry_run=True, plugin=plugin
        )
        return build(opts)["spec"].pod

    assert pod(True).env[rf.RESUME_ENV] == "1"
    bare = pod(False)
    assert rf.RESUME_ENV not in bare.env
    (check,) = [c for c in bare.checks if c["check"] == "preemption"]
    assert not check["ok"] and rf.RESUME_ENV in check["detail"] and "the engine ends" in check["detail"]
    assert any("the engine ends" in cost for cost in bare.costs)
