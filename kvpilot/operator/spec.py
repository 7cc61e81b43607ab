"""An InferenceService spec as typed values, with the CRD's defaults (so builders never guess)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpilot.operator.autoscaling.spec import AutoscalingSpec
from kvpilot.operator.pod_overrides import ContainerResources, DisruptionBudget, PodOverrides
from kvpilot.planner import KVStrategy
from kvpilot.strategy_schema import CALIBRATED_ATTENTIONS as CALIBRATED_ATTENTIONS
from kvpilot.strategy_schema import CALIBRATION, CRD_KEYS, default
from kvpilot.strategy_schema import MLA_ROPE_PAIRS as MLA_ROPE_PAIRS


@dataclass(frozen=True)
class ModelRef:
    """Where the checkpoint is and how to read its config.json without loading it."""

    uri: str
    sha256: str = ""
    config: Mapping[str, Any] | None = None  # inline config.json
    config_map: str = ""  # or: a ConfigMap holding it
    config_map_key: str = "config.json"
    endpoint: str = ""  # s3:// server or hf:// mirror (kvpilot.storage)
    credentials_secret: str = ""  # spec.model.credentialsSecretRef: the source's login


DEFAULT_CALIBRATION_KEY: str = CALIBRATION["key"].default
DEFAULT_CALIBRATION_TOKENS: int = CALIBRATION["tokens"].default


@dataclass(frozen=True)
class CalibrationRef:
    """spec.strategy.calibration: a ConfigMap key whose text calibrates the GQA/MLA conversion."""

    config_map: str
    key: str = DEFAULT_CALIBRATION_KEY
    tokens: int = DEFAULT_CALIBRATION_TOKENS  # the engine reads this many tokens of the text

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> CalibrationRef | None:
        if not raw:
            return None
        return cls(config_map=str(raw.get("configMap", "")), key=str(raw.get("key") or DEFAULT_CALIBRATION_KEY),
                   tokens=int(raw.get("tokens", DEFAULT_CALIBRATION_TOKENS)))


@dataclass(frozen=True)
class StrategySpec:
    """spec.strategy: the memory strategy of the stable track."""

    # Fields, CRD keys and defaults: kvpilot/strategy_schema.py's STRATEGY_FIELDS (the CRD's, the planner's)
    attention: str = default("attention")
    kv_head_groups: int | None = None
    latent_rank: int | None = None
    linear_window: int = default("linear_window")
    kv_cache_dtype: str = default("kv_cache_dtype")
    max_seq_len: int = default("max_seq_len")
    block_size: int = default("block_size")
    eviction: str = default("eviction")
    eviction_sinks: int = default("eviction_sinks")  # eviction: first tokens always kept
    eviction_window: int = default("eviction_window")  # ... and the recent tokens kept
    eviction_ladder_span: int | None = default("eviction_ladder_span")  # ladder: tokens per level (None: window)
    max_num_batched_tokens: int = default("max_num_batched_tokens")
    kv_quant_auto_threshold: int | None = None  # kvCacheDtype auto: int8 blocks from this batch size
    kv_quant_auto_split: float = default("kv_quant_auto_split")
    fallback_reserve: float = default("fallback_reserve")  # runtime validation's exact-path share of the pool
    calibration: CalibrationRef | None = None
    mla_rope_dims: int | None = None  # mla conversion: dims per KV head that keep RoPE (partial RoPE)
    # The CRD gives this no default: a default would appear in every stored object's strategy and change
    # the digest a promotion's override is keyed to (reconcile/tracks.py), reverting promoted services.
    mla_rope_pairs: str = default("mla_rope_pairs")

    @property
    def active_calibration(self) -> CalibrationRef | None:
        """The calibration the engine gets: only gqa and mla convert with it (a canary that switches to
        native or linear inherits the stable track's calibration and ignores it)."""
        return self.calibration if self.attention in CALIBRATED_ATTENTIONS else None

    @property
    def active_mla_rope_dims(self) -> int | None:
        """mlaRopeDims when attention is mla (parameters apply only to the chosen attention, as kvHeadGroups)."""
        return self.mla_rope_dims if self.attention == "mla" else None

    def planner_strategy(self) -> KVStrategy:
        return KVStrategy(
            attention=self.attention, kv_head_groups=self.kv_head_groups, latent_rank=self.latent_rank,
            kv_cache_dtype=self.kv_cache_dtype, block_size=self.block_size, linear_window=self.linear_window,
            fallback_reserve=self.fallback_reserve, kv_quant_auto_split=self.kv_quant_auto_split,
            kv_quant_auto_threshold=self.kv_quant_auto_threshold if self.kv_cache_dtype == "auto" else None,
            calibrated=self.active_calibration is not None, mla_rope_dims=self.active_mla_rope_dims,
            eviction=self.eviction, eviction_sinks=self.eviction_sinks, eviction_window=self.eviction_window,
            eviction_ladder_span=self.eviction_ladder_span,
        )


@dataclass(frozen=True)
class SecretKeyRef:
    """A key of a Secret in the service's namespace (its value never enters a spec the operator writes)."""

    name: str
    key: str = "api-key"


@dataclass(frozen=True)
class EngineSpec:
    """spec.engine: the image and extra flags of `kvpilot serve`."""

    image: str = "ghcr.io/kvpilot/kvpilot:latest"
    disable: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    termination_grace_period_seconds: int = 300
    api_key_secret: SecretKeyRef | None = None  # spec.engine.apiKeySecretRef -> --api-key-file


@dataclass(frozen=True)
class GatewayRef:
    """The Gateway an InferenceService's HTTPRoute attaches to."""

    name: str
    namespace: str


MODEL_HEADER = "X-Gateway-Model-Name"  # what the Gateway API Inference Extension's body-based router sets


@dataclass(frozen=True)
class RouteSpec:
    """spec.route: how the HTTPRoute <name> picks this service's requests on a shared Gateway."""

    gateway: GatewayRef | None = None  # default: spec.canary.gateway, then the operator's --gateway
    hostnames: tuple[str, ...] = ()  # Gateway API hostnames (Host header; exact or *.wildcard)
    model_header: str = ""  # match requests whose header equals the served model name (metadata.name)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None, namespace: str = "") -> RouteSpec:
        raw = raw or {}
        gateway = raw.get("gateway") or None
        return cls(
            gateway=GatewayRef(str(gateway["name"]), str(gateway.get("namespace") or namespace)) if gateway else None,
            hostnames=tuple(str(h) for h in raw.get("hostnames") or ()),
            model_header=str(raw.get("modelHeader") or ""),
        )


DEFAULT_STEPS = (1, 5, 100)
DEFAULT_INTERVAL_S = 300.0
DEFAULT_HEADER = "X-Model-Strategy"
DEFAULT_FAILURE_LIMIT = 2
_DURATION = re.compile(r"([0-9]+)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class CanarySpec:
    """spec.canary: what the canary track changes, and how the rollout proceeds and is judged."""

    strategy: Mapping[str, Any] = field(default_factory=dict)  # overrides of the stable strategy (camelCase)
    model: Mapping[str, Any] = field(default_factory=dict)  # a new checkpoint (uri, sha256, config)
    steps: tuple[int, ...] = DEFAULT_STEPS
    interval_s: float = DEFAULT_INTERVAL_S
    header: str = DEFAULT_HEADER
    gateway: GatewayRef | None = None
    paused: bool = False
    analysis: Mapping[str, Any] = field(default_factory=dict)  # thresholds, read by the analysis package
    failure_limit: int = DEFAULT_FAILURE_LIMIT
    replicas: int | None = None  # fixed canary size; None: derived from each step's weight (rollout/replicas.py)
    spec_hash: str = ""
    error: str = ""  # what is wrong with spec.canary (the rollout fails with it; stable is unaffected)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], namespace: str = "") -> CanarySpec:
        gateway = raw.get("gateway") or None
        analysis = dict(raw.get("analysis") or {})
        steps = tuple(int(w) for w in raw.get("steps") or DEFAULT_STEPS)
        error = ""
        if any(not 1 <= w <= 100 for w in steps) or list(steps) != sorted(set(steps)):
            error = f"spec.canary.steps {list(steps)}: weights must rise strictly, each 1-100, e.g. [1, 5, 100]"
        try:
            interval_s = parse_duration(str(raw.get("interval", "5m")))
        except ValueError as exc:
            error, interval_s = f"spec.canary.interval: {exc}", DEFAULT_INTERVAL_S
        return cls(
            strategy=dict(raw.get("strategy") or {}),
            model=dict(raw.get("model") or {}),
            steps=steps,
            interval_s=interval_s,
            header=str(raw.get("header", DEFAULT_HEADER)),
            gateway=GatewayRef(str(gateway["name"]), str(gateway.get("namespace") or namespace)) if gateway else None,
            paused=bool(raw.get("paused", False)),
            analysis=analysis,
            failure_limit=int(analysis.get("failureLimit", DEFAULT_FAILURE_LIMIT)),
            replicas=int(raw["replicas"]) if raw.get("replicas") is not None else None,
            spec_hash=canary_hash(raw),
            error=error,
        )

    def track_dicts(self, model: Mapping[str, Any], strategy: Mapping[str, Any]) -> tuple[dict, dict]:
        """The canary's (model, strategy) dicts given the stable track's: overrides on top.

        A new checkpoint (a different uri) never inherits the stable digest; it keeps the stable
        config.json only when it brings none (same architecture, new weights).
        """
        new_model = dict(model)
        if self.model:
            if self.model.get("uri") and self.model.get("uri") != model.get("uri"):
                new_model.pop("sha256", None)
                if str(self.model["uri"]).partition("://")[0] != str(model.get("uri", "")).partition("://")[0]:
                    new_model.pop("endpoint", None)  # another kind of source: the stable one's server and login
                    new_model.pop("credentialsSecretRef", None)  # would be wrong for it
            if self.model.get("config") is not None:
                new_model.pop("configMapRef", None)
            new_model.update(self.model)
        return new_model, {**strategy, **self.strategy}


def parse_duration(text: str) -> float:
    """'90s', '5m', '1h30m', '500ms' -> seconds."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"duration {text!r}: use digits with ms, s, m or h, e.g. 30s, 5m, 1h30m")
    return sum(int(n) * _UNIT_S[u] for n, u in parts)


UNHASHED_CANARY_FIELDS = ("paused", "replicas")  # pausing or resizing a canary is not a new canary


def canary_hash(raw: Mapping[str, Any]) -> str:
    """What identifies a rollout: spec.canary without `paused` and `replicas`."""
    ident = {k: v for k, v in raw.items() if k not in UNHASHED_CANARY_FIELDS}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def track_digest(model: Mapping[str, Any], strategy: Mapping[str, Any]) -> str:
    """Identifies spec.model + spec.strategy, so a promotion knows when the user edited them since."""
    doc = {"model": model, "strategy": strategy}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ServiceSpec:
    """The whole spec of one InferenceService."""

    model: ModelRef
    strategy: StrategySpec = field(default_factory=StrategySpec)
    gpus: int = 1
    gpu_product: str = "NVIDIA-H200"
    gpu_product_label: str = ""  # node label holding gpu_product; "": the operator's --gpu-product-label
    container_resources: ContainerResources = field(default_factory=ContainerResources)
    pod: PodOverrides = field(default_factory=PodOverrides)
    disruption_budget: DisruptionBudget = field(default_factory=DisruptionBudget)
    replicas: int = 1
    engine: EngineSpec = field(default_factory=EngineSpec)
    rollback: bool = False
    canary: CanarySpec | None = None
    autoscaling: AutoscalingSpec | None = None  # on: an HPA per track sizes the tracks, not `replicas`
    route: RouteSpec = field(default_factory=RouteSpec)
    model_dict: Mapping[str, Any] = field(default_factory=dict, compare=False)  # spec.model as written
    strategy_dict: Mapping[str, Any] = field(default_factory=dict, compare=False)  # spec.strategy as written

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], namespace: str = "") -> ServiceSpec:
        model = spec.get("model") or {}
        ref = model.get("configMapRef") or {}
        strategy = {CRD_KEYS[k]: v for k, v in (spec.get("strategy") or {}).items() if k in CRD_KEYS}
        strategy["calibration"] = CalibrationRef.from_dict(strategy.get("calibration"))
        engine = spec.get("engine") or {}
        resources = spec.get("resources") or {}
        return cls(
            model=ModelRef(
                uri=str(model.get("uri", "")), sha256=str(model.get("sha256", "")),
                config=model.get("config"), config_map=str(ref.get("name", "")),
                config_map_key=str(ref.get("key", "config.json")), endpoint=str(model.get("endpoint") or ""),
                credentials_secret=str((model.get("credentialsSecretRef") or {}).get("name") or ""),
            ),
            strategy=StrategySpec(**{k: v for k, v in strategy.items() if k in StrategySpec.__dataclass_fields__}),
            gpus=int(resources.get("gpus", 1)),
            gpu_product=str(resources.get("gpuProduct", "NVIDIA-H200")),
            gpu_product_label=str(resources.get("gpuProductLabel") or ""),
            container_resources=ContainerResources.from_dict(resources),
            pod=PodOverrides.from_dict(spec.get("pod")),
            disruption_budget=DisruptionBudget.from_dict(spec.get("disruptionBudget")),
            replicas=int(spec.get("replicas", 1)),
            engine=EngineSpec(
                image=str(engine.get("image", EngineSpec.image)),
                disable=tuple(engine.get("disable") or ()),
                args=tuple(str(a) for a in engine.get("args") or ()),
                termination_grace_period_seconds=int(
                    engine.get("terminationGracePeriodSeconds", EngineSpec.termination_grace_period_seconds)
                ),
                api_key_secret=_secret_ref(engine.get("apiKeySecretRef")),
            ),
            rollback=bool(spec.get("rollback", False)),
            canary=CanarySpec.from_dict(spec["canary"], namespace) if spec.get("canary") else None,
            autoscaling=AutoscalingSpec.from_dict(spec.get("autoscaling")),
            route=RouteSpec.from_dict(spec.get("route"), namespace),
            model_dict=dict(model),
            strategy_dict=dict(spec.get("strategy") or {}),
        )


def _secret_ref(raw: Mapping[str, Any] | None) -> SecretKeyRef | None:
    if not raw or not raw.get("name"):
        return None
    return SecretKeyRef(name=str(raw["name"]), key=str(raw.get("key") or SecretKeyRef.key))
