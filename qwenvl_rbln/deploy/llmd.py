"""What llm-d's optimized-baseline guide expects of a model server, for ``--target llm-d``.

Followed files (llm-d/llm-d): ``guides/optimized-baseline/modelserver/npu/vllm/kustomization.yaml`` (the labels),
``guides/optimized-baseline/modelserver/npu/vllm/patch-vllm.yaml`` (the Deployment's shape),
``guides/optimized-baseline/modelserver/npu/vllm/base/resource-claim-template.yaml`` (the claim),
``guides/optimized-baseline/router/optimized-baseline.values.yaml`` and ``router/npu.rbln.values.yaml`` (the
router's values: its EndpointPickerConfig and ``modelServers.matchLabels``), and ``guides/optimized-baseline/
guide.yaml`` (helm install of the router with those values, then ``kubectl apply -k`` of the model server).
"""

from __future__ import annotations

from typing import Any

from qwenvl_rbln.deploy.options import PORT
from qwenvl_rbln.deploy.yamltext import Note

GUIDE = "optimized-baseline"
GUIDE_FILES = (
    "guides/optimized-baseline/modelserver/npu/vllm/kustomization.yaml",
    "guides/optimized-baseline/modelserver/npu/vllm/patch-vllm.yaml",
    "guides/optimized-baseline/modelserver/npu/vllm/base/resource-claim-template.yaml",
    "guides/optimized-baseline/router/optimized-baseline.values.yaml",
    "guides/optimized-baseline/router/npu.rbln.values.yaml",
    "guides/optimized-baseline/guide.yaml",
)
EPP_PORT = 9002  # the endpoint picker's ext-proc port (the router chart's default)


# The prefix-cache-affinity-filter's parameters in the guide's router/optimized-baseline.values.yaml, kept as they are
# (affinityThreshold 0.80: sticky at an 80 % prefix match; maxTTFTPenaltyMs 0: always stick, the TTFT load gate off).
# Its third, maxTokensInFlightPenalty, is left out: it is not a field of the filter in llm-d/llm-d-router (ebab6879,
# pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity), whose strict decoder refuses an unknown key.
GUIDE_FILTER = {"affinityThreshold": 0.80, "maxTTFTPenaltyMs": 0}
DROPPED_FILTER_KEYS = ("maxTokensInFlightPenalty",)
ROUTER_TTFT_PENALTY_MS = 18000  # the filter's own default for maxTTFTPenaltyMs (its README's Config table)


def labels(model_label: str) -> dict[str, str]:
    """The pod labels the guide's NPU kustomization sets (guide, model, accelerator) and its base recipe's role,
    exactly those five: qvl's own marks are the app.kubernetes.io labels beside them."""
    return {
        "llm-d.ai/guide": GUIDE,
        "llm-d.ai/model": model_label,
        "llm-d.ai/role": "decode",
        "llm-d.ai/accelerator-variant": "npu",
        "llm-d.ai/accelerator-vendor": "rebellions",
    }


def router_values(select: dict[str, str], max_model_len: int, prefill: dict[str, Any]) -> dict[str, Any]:
    """Values layered after the guide's router values (``helm install ... -f base -f optimized-baseline.values.yaml
    -f THIS``): the model servers to route to, and the prefix-cache filter sized for this artifact."""
    params: dict[str, Any] = {
        key: Note(
            value,
            "The guide's value (router/optimized-baseline.values.yaml)"
            + (
                f": the TTFT load gate is off (always stick to the replica holding the prefix), so "
                f"peakPrefillThroughput below is read only once you set this (the router's default is "
                f"{ROUTER_TTFT_PENALTY_MS} ms: leave a sticky replica whose queue makes its TTFT that much longer)."
                if key == "maxTTFTPenaltyMs"
                else "."
            ),
        )
        for key, value in GUIDE_FILTER.items()
    }
    if prefill.get("tokens_per_s"):
        why = (
            f"Measured by `qvl profile` on the NPU ({prefill['label']}): one replica's first {prefill['chunk']}-token "
            "prefill chunk, the graph alone (no scheduling, no vision); the guide's guides/recipes/router/calibration "
            "measures the whole server."
            if prefill.get("measured")
            else f"An estimate, not measured: qvl tune's cost model ({prefill['label']}) for one replica's first "
            f"{prefill['chunk']}-token prefill chunk. A roofline bound is an upper bound on speed, so the router "
            "expects prefill to be faster than it is; run `qvl profile` on the NPU host, or measure it with the "
            "guide's guides/recipes/router/calibration, and replace this number."
        )
        params["peakPrefillThroughput"] = Note(prefill["tokens_per_s"], why)
    why_missing = (
        ""
        if "peakPrefillThroughput" in params
        else f" No prefill estimate: {prefill.get('reason')}; the filter keeps its default peakPrefillThroughput."
    )
    dropped = (
        f" The filter's parameters are the guide's, except {', '.join(DROPPED_FILTER_KEYS)}, left out: it is not a "
        "field of the prefix-cache-affinity-filter in llm-d-router, whose strict decoder would refuse the file; and "
        "peakPrefillThroughput, this artifact's own."
    )
    config = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "token-load-scorer"},
            {"type": "inflight-load-producer"},
            {"type": "approx-prefix-cache-producer", "parameters": {"maxPrefixTokensToMatch": max_model_len}},
            {"type": "prefix-cache-affinity-filter", "parameters": params},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [{"pluginRef": "prefix-cache-affinity-filter"}, {"pluginRef": "token-load-scorer"}],
            }
        ],
    }
    from qwenvl_rbln.deploy.yamltext import dump

    text = dump(
        config,
        f"maxPrefixTokensToMatch is the --max-model-len the model servers run with ({max_model_len}).{why_missing}"
        f"{dropped}",
    )
    return {
        "router": {
            "epp": {
                "pluginsConfigFile": "optimized-baseline-plugins.yaml",
                "pluginsCustomConfig": Note(
                    {"optimized-baseline-plugins.yaml": text},
                    "The guide's plugin set and filter parameters (router/optimized-baseline.values.yaml) with this "
                    "artifact's numbers; the file below says what differs from the guide and why. vllm-rbln 0.11.1a1 "
                    "turns prefix caching off for every multimodal model, Qwen3-VL included, so its replicas report no "
                    "prefix-cache hits: drop the filter as router/npu.rbln.values.yaml does and keep the "
                    "token-load-scorer.",
                ),
            },
            "modelServers": Note(
                {"matchLabels": dict(select)},
                f"Selects exactly this model server's pods (they listen on {PORT}, the port the pool targets).",
            ),
        }
    }


def inference_pool(name: str, select: dict[str, str]) -> dict[str, Any]:
    """The InferencePool the router chart creates from the values above, written out for a gateway set up without
    that chart (not in kustomization.yaml: applying both would fight over one object)."""
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": dict(select)},
            "targetPorts": [{"number": PORT}],
            "endpointPickerRef": Note(
                {"name": f"{name}-epp", "port": {"number": EPP_PORT}},
                "The endpoint picker (EPP) Service you run for this pool; the router chart names it <release>-epp.",
            ),
        },
    }
