"""One min_pixels floor for the largest ViT bucket (planning.catalogue.modelinfo.min_pixels_bucket), used by both
the plan's refusal ("no image fits") and tune's bucket choice: it was computed twice, in planning/plan.py and in
tuning/workload.py."""

from __future__ import annotations

import pytest


def test_one_min_pixels_floor_serves_the_plan_and_tune(monkeypatch):
    from qwenvl_rbln.errors import InputError
    from qwenvl_rbln.planning.catalogue import modelinfo
    from qwenvl_rbln.planning.plan import build_plan
    from qwenvl_rbln.tuning.workload import min_pixels_bucket

    assert modelinfo.min_pixels_bucket(65536) == 256 and modelinfo.min_pixels_bucket(65537) == 260
    plan = build_plan("rebel100-1npu")
    assert min_pixels_bucket(plan) == modelinfo.min_pixels_bucket(plan.processor.min_pixels)
    asked: list[tuple] = []
    monkeypatch.setattr(modelinfo, "min_pixels_bucket", lambda *a, **k: asked.append(a) or 12344)  # one place decides
    assert min_pixels_bucket(plan) == 12344
    with pytest.raises(InputError, match="so no image fits") as err:
        build_plan("rebel100-1npu", ["visual.max_seq_len=64"])
    assert "make the largest bucket at least 12344 patches" in (err.value.hint or "")
    v = plan.geometry.vision  # both ask with the model's own patch geometry, not a default
    assert asked == [(plan.processor.min_pixels, v.patch_size, v.spatial_merge_size)] * 2
