"""Acceptance rules (spec section 3) and their registry. Each rule only says how it relaxes the target
distribution.

With ``p_hat`` the rule's relaxed target at draft depth ``d``, a candidate ``y ~ q`` is accepted with
probability ``f_d(y) = min(1, p_hat(y) / q(y))``, so the accepted mass is ``a = q * f = min(q, p_hat)``.
Eagle-1 is ``p_hat = p``; UniformRSD ``delta * p``; COOL-SD ``omega_d * p``; LANTERN++ ``p~``.
On rejection the optimal residual ``G* = Norm([p - a]_+)`` replaces ``p`` unless a rule overrides it.
Rules are torch code over batched rows: ``p`` and ``q`` are ``(..., V)`` on any device and dtype, a depth is an
int or a long tensor that broadcasts against ``p[..., :1]`` (one depth per row), so the engine evaluates every
node of a draft tree at once (on the CPU in float64, where the exactness tests hold to rounding). A new rule
is one subclass with ``relaxed_target`` (and ``omega`` if it has a schedule) plus one
:func:`register` call with its parameter schema: the command line, the benchmark's method specs, the app's
controls and the plots read the registry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from .params import PARAMS, Choice, Param, number, shorten

# No draft deeper than this is ever useful (acceptance decays geometrically with depth), and a chain's paths,
# levels and mask grow quadratically with its length (chain:20000 took 31 s and 3.4 GB), so absurd lengths are
# refused before anything is built (coolsd.core.trees), and per-depth tables stop here.
MAX_DRAFT_DEPTH = 1024


def normalise(mass: Tensor, fallback: Tensor) -> Tensor:
    """Each row's ``mass / sum(mass)``, or ``fallback``'s row where the mass is (numerically) zero (spec
    section 3)."""
    total = mass.sum(-1, keepdim=True)
    return torch.where(total > 1e-12, mass / total, fallback)  # rows with no mass take the fallback's row


def step_cost(p: Tensor, accepted: Tensor) -> Tensor:
    """``e = sum_y [q(y) f(y) - p(y)]_+`` per row: the TV distance one verification step adds (spec section 4)."""
    return (accepted - p).clamp_min(0).sum(-1)


def as_index(value: "Tensor | int", like: Tensor) -> Tensor:
    """A depth or token given as an int, as a long tensor on ``like``'s device (a tensor passes through)."""
    return value if isinstance(value, Tensor) else torch.tensor(value, dtype=torch.long, device=like.device)


class AcceptanceRule:
    """Lossless Eagle-1: ``p_hat = p``."""

    name = "eagle"
    drafts = True  # False: the engine drafts nothing, whatever the draft tree (AR)

    def params(self) -> dict:
        return {}

    def omega(self, depth: int) -> float:
        """The multiplier on ``r = p/q`` at ``depth`` (1 for rules without one)."""
        return 1.0

    @property
    def relaxes(self) -> bool:
        """Whether ``q f`` may exceed ``p`` somewhere (it relaxes the target), so that a step can cost e > 0 and
        the walk computes it: true of every rule that defines its own relaxed target."""
        return type(self).relaxed_target is not AcceptanceRule.relaxed_target

    def relaxed_target(self, p: Tensor, depth: "Tensor | int") -> Tensor:
        return p

    def accepted_mass(self, p: Tensor, q: Tensor, depth: "Tensor | int") -> Tensor:
        """``q * f_d`` at every token: the joint probability of drafting and accepting it."""
        return torch.minimum(q, self.relaxed_target(p, depth))

    def residual(self, p: Tensor, q: Tensor, rejected: "Tensor | int", depth: "Tensor | int",
                 accepted: Tensor | None = None) -> Tensor:
        """Target distribution after ``rejected`` (one token per row) was refused: ``G* = Norm([p - q f]_+)``.
        ``accepted`` is ``accepted_mass(p, q, depth)`` when the caller already has it."""
        if accepted is None:
            accepted = self.accepted_mass(p, q, depth)
        return normalise((p - accepted).clamp_min(0), p)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.params().items())
        return f"{self.name}({args})"


Eagle = AcceptanceRule


class AR(AcceptanceRule):
    """Vanilla autoregressive decoding: nothing is drafted, one token per target forward."""

    name = "ar"
    drafts = False


class UniformRSD(AcceptanceRule):
    """``f = min(1, delta * r)`` at every depth."""

    name = "uniform"

    def __init__(self, delta: float = 2.0) -> None:  # a class's defaults are its schema's (test_rules checks)
        self.delta = float(number("delta", delta, above=0))

    def params(self) -> dict:
        return {"delta": self.delta}

    def omega(self, depth: int) -> float:
        return self.delta

    def relaxed_target(self, p: Tensor, depth: "Tensor | int") -> Tensor:
        return self.delta * p


def resolve_mu(nu: float, mu: float | str, depth: int, schedule: str = "exp") -> float:
    """The numeric ``mu``; ``"auto"`` makes the mean of ``omega_1..omega_depth`` equal ``delta`` (spec section 3)."""
    if mu != "auto":
        return float(number("mu", mu))
    if schedule == "linear":
        return -nu * (depth + 1) / 2
    return math.log(np.exp(-nu * np.arange(1, depth + 1)).mean())


def linear_schedule_error(nu: float, mu: float, auto_mu: bool, depth: int, omegas: np.ndarray) -> str:
    """Why ``omega_d = delta (1 - nu d - mu)`` is not positive: the first position where it fails, the
    parameter that causes it, and which way to move that parameter."""
    worst = depth if nu > 0 else 1  # omega is monotone in d: the smallest sits at one end of the window
    where = (f"omega_{worst} = {omegas[worst - 1]:.3g} <= 0 at draft position {worst} of {depth} "
             f"(linear schedule: omega_d = delta * (1 - nu*d - mu))")
    if auto_mu:  # mu = -nu (D+1)/2, so omega_d = delta (1 + nu ((D+1)/2 - d)): only nu's size matters
        bound = 2 / (depth - 1)
        move = f"lower nu below {bound:.3g}" if nu > 0 else f"raise nu above {-bound:.3g}"
        return f"nu={nu:g} is too steep for a linear schedule with mu=auto: {where}; {move} or use schedule 'exp'"
    if mu >= 1 or nu <= 0:  # the offset alone makes omega non-positive
        return f"mu={mu:g} is too large: {where}; lower mu below {1 - nu * worst:.3g}"
    return (f"nu={nu:g} is too steep for a linear schedule with mu={mu:g}: {where}; lower nu below "
            f"{(1 - mu) / depth:.3g}, or lower mu")


def omega_schedule(delta: float, nu: float, mu: float | str, depth: int, schedule: str = "exp") -> list[float]:
    """COOL-SD's ``omega_1..omega_D`` (spec section 3).

    ``exp``: ``delta * exp(-nu d - mu)``; ``linear``: ``delta * (1 - nu d - mu)``, its first-order counterpart
    (the paper's linear-decay ablation).
    """
    delta, nu = float(number("delta", delta, above=0)), float(number("nu", nu))
    depth = number("depth", depth, 1, integer=True)
    SCHEDULE.check(schedule)
    auto_mu = mu == "auto"
    mu = resolve_mu(nu, mu, depth, schedule)
    d = np.arange(1, depth + 1, dtype=np.float64)
    with np.errstate(over="ignore"):
        omegas = delta * np.exp(-nu * d - mu) if schedule == "exp" else delta * (1 - nu * d - mu)
    if schedule == "linear" and omegas.min() <= 0:
        raise ValueError(linear_schedule_error(nu, mu, auto_mu, depth, omegas))
    if not np.all(np.isfinite(omegas)):
        raise ValueError(f"omega overflows for delta={delta}, nu={nu}, mu={mu}")
    return omegas.tolist()


class CoolSD(AcceptanceRule):
    """``f_d = min(1, omega_d * r)`` with the annealed schedule ``omega_d`` (relax early depths more)."""

    name = "cool"

    def __init__(self, delta: float = 2.0, nu: float = 0.7, mu: float | str = "auto", depth: int = 5,
                 schedule: str = "exp") -> None:
        self.omegas = omega_schedule(delta, nu, mu, depth, schedule)
        self.delta, self.nu, self.mu, self.depth, self.schedule = float(delta), float(nu), mu, depth, schedule
        self.tables: dict[tuple, Tensor] = {}

    def params(self) -> dict:
        return {"delta": self.delta, "nu": self.nu, "mu": self.mu, "schedule": self.schedule}

    def omega(self, depth: int) -> float:
        return self.omegas[min(depth, self.depth) - 1]

    def relaxed_target(self, p: Tensor, depth: "Tensor | int") -> Tensor:
        if not isinstance(depth, Tensor):
            return self.omega(depth) * p
        key = (p.device, p.dtype)  # omega by depth on the rows' device (index 0 unused; deeper: omega_D)
        if key not in self.tables:
            padded = self.omegas[:1] + self.omegas + self.omegas[-1:] * max(0, MAX_DRAFT_DEPTH - self.depth)
            self.tables[key] = torch.tensor(padded, dtype=p.dtype, device=p.device)
        return self.tables[key].index_select(0, depth.reshape(-1)).view(depth.shape) * p


def nearest_codes(codebook: Tensor, count: int, chunk: int = 2048) -> np.ndarray:
    """For each code, the indices of its ``count`` nearest other codes by L2 distance, nearest first."""
    codebook = codebook.float()
    count = min(count, codebook.shape[0] - 1)
    rows = []
    for start in range(0, codebook.shape[0], chunk):
        block = torch.cdist(codebook[start:start + chunk], codebook)
        block[torch.arange(block.shape[0]), torch.arange(start, start + block.shape[0])] = math.inf
        rows.append(torch.topk(block, count, dim=1, largest=False).indices)  # ties: lowest index first
    return torch.cat(rows).numpy()


class Lantern(AcceptanceRule):
    """LANTERN++: ``p~(y) = p(y) + S_{m*}(y)``, the mass of up to ``k`` nearest codes that keeps
    ``p~ <= lambda * p`` (spec section 3). ``residual="lantern"`` reproduces the published heuristic."""

    name = "lantern"

    def __init__(self, neighbours: np.ndarray, k: int = 10, lam: float = 5.0, residual: str = "gstar") -> None:
        k, lam = number("k", k, 0, integer=True), number("lambda", lam, 1)
        RESIDUAL.check(residual)
        if neighbours.shape[1] < k + (residual == "lantern"):
            raise ValueError(f"k={k} needs {k + 1} neighbours per code, the table has {neighbours.shape[1]}")
        self.k, self.lam, self.residual_kind = k, float(lam), residual
        self.wider = np.ascontiguousarray(neighbours[:, :k + 1])  # the heuristic residual clears k+1 neighbours
        self.tables: dict[torch.device, Tensor] = {}

    def params(self) -> dict:
        return {"k": self.k, "lambda": self.lam, "residual": self.residual_kind}

    def table(self, device: torch.device) -> Tensor:
        """Each code's nearest codes (V, k + 1), nearest first, on ``device`` (copied there once)."""
        if device not in self.tables:
            self.tables[device] = torch.from_numpy(self.wider).long().to(device)
        return self.tables[device]

    def relaxed_target(self, p: Tensor, depth: "Tensor | int") -> Tensor:
        """``S_m`` is a running sum over the nearest codes that only grows, so ``S_{m*}``, the last one with
        ``S_m <= (lambda - 1) p``, is the largest such running sum (0 when none qualifies)."""
        if self.k == 0:
            return p
        running = p[..., self.table(p.device)[:, :self.k]].cumsum(-1)  # (..., V, k): S_1..S_k of every token
        qualifying = running <= (self.lam - 1) * p[..., None]
        return p + torch.where(qualifying, running, 0).amax(-1)

    def residual(self, p: Tensor, q: Tensor, rejected: "Tensor | int", depth: "Tensor | int",
                 accepted: Tensor | None = None) -> Tensor:
        """``gstar``: ``Norm([p - min(q, p~)]_+)`` (which is ``Norm([p - q]_+)``, as ``p~ >= p``). ``lantern``:
        on rejecting ``y`` with ``m*(y) >= 1``, ``q`` is cleared on its ``k + 1`` nearest codes first."""
        if self.residual_kind == "gstar" or self.k == 0:
            return super().residual(p, q, rejected, depth, accepted)
        rejected = as_index(rejected, p)
        near = self.table(p.device)[rejected]  # (..., k + 1)
        own = p.gather(-1, rejected[..., None])
        spreads = p.gather(-1, near[..., :1]) <= (self.lam - 1) * own  # m*(y) >= 1: the nearest code qualifies
        cleared = torch.where(spreads, q.scatter(-1, near, 0.0), q)
        return normalise((p - cleared).clamp_min(0), p)


def close_pairs(embeddings: Tensor, threshold: float, chunk: int = 2048) -> Tensor:
    """(V, V) bool: whether two tokens' input embeddings lie within squared L2 distance ``threshold`` (GSD's
    filter; a token is close to itself), computed in chunks on the embeddings' device. V * V bytes."""
    table = embeddings.float()
    rows = [torch.cdist(table[start:start + chunk], table).square() < threshold
            for start in range(0, len(table), chunk)]
    return torch.cat(rows)


class Grouped(AcceptanceRule):
    """GSD's grouped acceptance (spec section 11): ``f(y) = min(1, p(G(y)) / q(G(y)))``, ``G(y)`` the tokens whose
    rank in the target's order of ``p`` is within ``[c - ranks, c + ranks)`` of ``y``'s rank ``c`` (``2 ranks``
    candidates with ``y``, as the published slice), kept where ``|p(g) - p(y)| < gap`` and their input embeddings
    are within squared distance ``distance`` of ``y``'s. The accepted token is ``y`` itself. ``residual="gsd"`` is
    the published token-level ``Norm([p - q]_+)``; ``"gstar"`` is ``G*`` of this ``f`` (section 3). Ranks come from
    a stable ascending sort of ``p``: equal probabilities (the filtered-out zeros) are ordered by token id."""

    name = "gsd"

    def __init__(self, embeddings: Tensor, ranks: int = 7, gap: float = 0.15, distance: float = 0.5,
                 residual: str = "gsd") -> None:
        self.ranks = number("ranks", ranks, 1, integer=True)
        self.gap, self.distance = float(number("gap", gap, above=0)), float(number("dist", distance, above=0))
        GSD_RESIDUAL.check(residual)
        self.residual_kind, self.embeddings = residual, embeddings
        self.tables: dict[torch.device, Tensor] = {}

    relaxes = True  # the group's mass may exceed the token's: a step can cost e > 0

    def params(self) -> dict:
        return {"ranks": self.ranks, "gap": self.gap, "dist": self.distance, "residual": self.residual_kind}

    def close(self, device: torch.device) -> Tensor:
        """The flattened (V * V,) closeness table on ``device``, computed there once."""
        if device not in self.tables:
            self.tables[device] = close_pairs(self.embeddings.to(device), self.distance).flatten()
        return self.tables[device]

    def accepted_mass(self, p: Tensor, q: Tensor, depth: "Tensor | int") -> Tensor:
        vocab = p.shape[-1]
        order = torch.sort(p, dim=-1, stable=True).indices  # ascending: rank c holds token order[c]
        every = torch.arange(vocab, device=p.device)
        rank = torch.empty_like(order).scatter_(-1, order, every.expand_as(order))
        offsets = torch.arange(-self.ranks, self.ranks, device=p.device)
        at = rank[..., None] + offsets  # (..., V, 2 ranks): the ranks of each token's window
        inside = (at >= 0) & (at < vocab)
        members = order.gather(-1, at.clamp(0, vocab - 1).flatten(-2)).view(at.shape)
        p_members = p.gather(-1, members.flatten(-2)).view(at.shape)
        q_members = q.gather(-1, members.flatten(-2)).view(at.shape)
        near = self.close(p.device).index_select(0, (every[:, None] * vocab + members).flatten()).view(at.shape)
        group = inside & near & ((p_members - p[..., None]).abs() < self.gap)
        group_p, group_q = (p_members * group).sum(-1), (q_members * group).sum(-1)
        return q * (group_p / group_q.clamp_min(torch.finfo(q.dtype).tiny)).clamp_max(1)

    def residual(self, p: Tensor, q: Tensor, rejected: "Tensor | int", depth: "Tensor | int",
                 accepted: Tensor | None = None) -> Tensor:
        if self.residual_kind == "gsd":  # the published token-level residual
            return normalise((p - q).clamp_min(0), p)
        return super().residual(p, q, rejected, depth, accepted)


# The registry ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RuleSpec:
    """A method as users name it: ``build(params, depth, model)`` makes its rule from checked parameters
    (all of them: :func:`build_rule` fills those not given from the schema's defaults), for a draft of ``depth``
    positions; ``model`` gives the model's tables a rule may need (:class:`ModelTables`). ``params`` is the parameter
    schema (names, ranges, defaults, labels, help); ``swept`` the one whose value varies along a family's line in
    the plots (its strength); ``variants`` the app's entries with some parameters fixed (label -> fixed values);
    ``drafts`` False for a method that drafts nothing (AR)."""

    name: str
    label: str
    build: Callable[[dict, int, "ModelTables"], AcceptanceRule]
    params: tuple[Param | Choice, ...] = ()
    swept: tuple[str, ...] = ()
    variants: dict[str, dict] = field(default_factory=dict)
    help: str = ""
    drafts: bool = True

    def param(self, name: str) -> Param | Choice:
        for spec in self.params:
            if spec.name == name:
                return spec
        raise ValueError(f"method {self.name!r} takes no parameter {shorten(name)} "
                         f"(it takes: {', '.join(p.name for p in self.params) or 'none'})")

    def defaults(self) -> dict:
        """Every parameter's default, from its schema: the one source of defaults for every front end."""
        return {schema.name: schema.default for schema in self.params}

    def entries(self) -> dict[str, dict]:
        """The app's method entries: label -> fixed parameter values."""
        return self.variants or {self.label: {}}


RULES: dict[str, RuleSpec] = {}


def register(spec: RuleSpec) -> RuleSpec:
    """Add a method to every front end (command line, benchmark specs, app, plots)."""
    if spec.name in RULES:
        raise ValueError(f"a method named {spec.name!r} is already registered")
    RULES[spec.name] = spec
    return spec


def rule_spec(name: str) -> RuleSpec:
    if name not in RULES:
        raise ValueError(f"method must be one of {', '.join(RULES)}; got {shorten(name)}")
    return RULES[name]


def param(name: str) -> Param | Choice:
    """A method parameter's schema by name (from the first registered method that takes it)."""
    for spec in RULES.values():
        for schema in spec.params:
            if schema.name == name:
                return schema
    raise KeyError(name)


def schema(name: str) -> Param | Choice:
    """Any user-facing parameter's one definition: a method parameter's schema, else ``coolsd.core.params``'."""
    return PARAMS[name] if name in PARAMS else param(name)


def check_params(name: str, params: dict | None) -> dict:
    """The method's parameters checked against its schema (unknown names refused)."""
    spec = rule_spec(name)
    return {key: spec.param(key).check(value) for key, value in (params or {}).items()}


@dataclass(frozen=True)
class ModelTables:
    """What a rule may need from the model: ``neighbours(count)``, each code's nearest codes (LANTERN++), and
    ``embeddings()``, the target's input embedding table (V, dim) (GSD); None where the model lacks one."""

    neighbours: Callable[[int], np.ndarray] | None = None
    embeddings: Callable[[], Tensor] | None = None


def model_tables(model: object) -> ModelTables:
    """A bundle (anything with ``neighbours`` and ``embeddings`` methods), a bare neighbour function, or None."""
    if model is None or isinstance(model, ModelTables):
        return model or ModelTables()
    if not hasattr(model, "neighbours"):
        return ModelTables(neighbours=model)
    return ModelTables(model.neighbours, getattr(model, "embeddings", None))


def build_rule(method: str, params: dict | None, depth: int, model: object = None) -> AcceptanceRule:
    """Method name + parameters -> acceptance rule, built once per request (see :class:`RuleSpec`); a parameter
    not given takes its schema's default. ``model``: a bundle (or a neighbour function, or :class:`ModelTables`)."""
    spec = rule_spec(method)
    return spec.build({**spec.defaults(), **check_params(method, params)}, depth, model_tables(model))


def lantern(params: dict, depth: int, model: ModelTables) -> Lantern:
    if model.neighbours is None:
        raise ValueError("method 'lantern' needs the tokenizer's codebook, which this model lacks")
    k = params["k"]
    return Lantern(model.neighbours(k + 1), k=k, lam=params["lambda"], residual=params["residual"])


def grouped(params: dict, depth: int, model: ModelTables) -> Grouped:
    if model.embeddings is None:
        raise ValueError("method 'gsd' needs the target's input embeddings, which this model does not expose")
    return Grouped(model.embeddings(), params["ranks"], params["gap"], params["dist"], params["residual"])


DELTA = Param("delta", 0.05, 5.0, 2.0, 0.05, "δ (delta): total relaxation",
              help="multiplies p/q: more acceptance, more distortion (1 = lossless)")
SCHEDULE = Choice("schedule", ("exp", "linear"), "exp", "COOL-SD schedule of ω",
                  help="exp: omega_d = delta exp(-nu d - mu); linear: delta (1 - nu d - mu)")
RESIDUAL = Choice("residual", ("gstar", "lantern"), "gstar", "residual after a rejection",
                  help="gstar: the optimal G*; lantern: the published heuristic")
register(RuleSpec("cool", "COOL-SD", lambda params, depth, _: CoolSD(depth=max(depth, 1), **params), (
    DELTA,
    Param("nu", -1.0, 2.0, 0.7, 0.05, "ν (nu): decay per draft position", help="how fast omega falls with depth"),
    Param("mu", -5.0, 5.0, "auto", 0.01, "μ (mu): offset", words=("auto",),
          help="auto: the mean of omega_1..omega_L equals delta"),
    SCHEDULE), swept=("delta",), help="annealed relaxation: omega_d = delta exp(-nu d - mu), resampling from G*"))
register(RuleSpec("uniform", "UniformRSD", lambda params, depth, _: UniformRSD(**params), (DELTA,), swept=("delta",),
                  help="the same relaxation delta at every depth"))
register(RuleSpec("lantern", "LANTERN++", lantern, (
    Param("k", 0, 50, 10, 1, "LANTERN++ k (neighbours)", integer=True, help="nearest codes whose mass may count"),
    Param("lambda", 1.0, 10.0, 5.0, 0.1, "LANTERN++ λ (lambda)", help="the relaxed target stays below lambda p"),
    RESIDUAL), swept=("k", "lambda"),
    variants={"LANTERN++": {"residual": "lantern"}, "LANTERN++ with G*": {"residual": "gstar"}},
    help="p~ adds the mass of up to k nearest codes"))
GSD_RESIDUAL = Choice("residual", ("gsd", "gstar"), "gsd", "residual after a rejection",
                      help="gsd: the published token-level Norm([p - q]+); gstar: the optimal G* of the grouped f")
register(RuleSpec("gsd", "GSD", grouped, (
    Param("ranks", 1, 64, 7, 1, "GSD ranks (half-width)", integer=True,
          help="the group: tokens within this many ranks of the draft in the target's order"),
    Param("gap", 0.01, 1.0, 0.15, 0.01, "GSD probability gap", help="group members differ from p(y) by less"),
    Param("dist", 0.01, 10.0, 0.5, 0.01, "GSD embedding distance", help="squared L2 between input embeddings below"),
    GSD_RESIDUAL), swept=("gap",),
    variants={"GSD": {"residual": "gsd"}, "GSD with G*": {"residual": "gstar"}},
    help="accepts y with the mass of its group of similar tokens: min(1, p(G)/q(G))"))
register(RuleSpec("eagle", "Eagle-1 (lossless)", lambda params, depth, _: Eagle(), help="min(1, p/q): exact"))
register(RuleSpec("ar", "AR (no drafting)", lambda params, depth, _: AR(), help="one token per target forward",
                  drafts=False))
METHODS = tuple(RULES)  # the built-in methods, in the app's order
