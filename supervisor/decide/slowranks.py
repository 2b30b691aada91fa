"""PURE: the step of a pass about slow but alive ranks (stragglers.py says what is slow and
when a move pays): a host named slow is said (WorkerSlow) and, when the supervisor owns the
workers, moving it pays and the move budget has room, moved: its pod is handed to the announced
leaves (leaving.py), which place its replacement first, kept off its node."""

from __future__ import annotations

from dataclasses import replace

from supervisor.decide import stragglers
from supervisor.decide.memory import Passing, Seen, Settings, current_slot
from supervisor.decide.plan import Note
from supervisor.model import EventSpec

# The widest factor measured so far is logged each time it grows by this much (the margin the
# shipped SLOW_FACTOR leaves, read in every job's log).
WIDEST_STEP = 0.25
WIDEST_LINK_STEP_S = 0.001  # and the widest excess of a host's fastest link, by this much


def step(p: Passing, s: Seen, st: Settings) -> None:
    """Step 2b: the straggler watch on this pass's heartbeats (while horovodrun runs)."""
    c = p.c
    ch = stragglers.watch(c.slow, s.beats, s.now, st.slow, st.hang.silence_s)
    w = ch.watch
    ix = s.facts(st.plan.job)

    def where(host: str) -> tuple[str | None, str | None]:
        pod = s.listed_hosts.get(host)
        f = ix.pods.get(pod or "")
        return pod, None if f is None else f.node

    if w.widest is not None and w.worst >= c.slow.worst + WIDEST_STEP:
        x = w.widest  # the margin below SLOW_FACTOR, in the log
        p.todo.append(Note("info", "stragglers.widest", {
            "factor": round(x.factor, 2), "slow_factor": st.slow.factor, "host": x.host,
            "ranks": list(x.ranks), "out_ms": round(x.out_s * 1000, 1),
            "median_ms": round(x.median_s * 1000, 1), "wait_ms": round(x.comm_s * 1000, 1)}))
    if w.widest_link is not None and w.link_excess >= c.slow.link_excess + WIDEST_LINK_STEP_S:
        x = w.widest_link  # the margin below the links' verdict, in the log
        p.todo.append(Note("info", "stragglers.widest_link", {
            "excess_ms": round((x.out_s - x.median_s) * 1000, 2),
            "min_excess_ms": stragglers.LINK_MIN_EXCESS_S * 1000, "host": x.host,
            "ranks": list(x.ranks), "rtt_ms": round(x.out_s * 1000, 2),
            "median_ms": round(x.median_s * 1000, 2)}))
    for x in ch.suspected:  # the evidence before a verdict, in the log only
        p.todo.append(Note("info", "worker.slow_suspected", {
            "host": x.host, "kind": x.kind, "ranks": list(x.ranks), "factor": round(x.factor, 2),
            "out_ms": round(x.out_s * 1000, 1), "median_ms": round(x.median_s * 1000, 1),
            "wait_ms": round(x.comm_s * 1000, 1)}))
    for x in ch.cleared:
        p.todo.append(Note("info", "worker.slow_cleared", {
            "host": x.host, "kind": x.kind, "factor": round(x.factor, 2),
            "after_s": round(s.now - x.since, 1)}))
    for x in ch.named:
        pod, node = where(x.host)
        ranks = ", ".join(map(str, x.ranks))
        why = (f"rank {ranks} (pod {pod} on node {node}) has been slow for "
               f"{s.now - x.since:.0f}s: {stragglers.describe(x)}")
        p.todo.append(Note("warning", "worker.slow", {
            "pod": pod, "node": node, "host": x.host, "kind": x.kind, "ranks": list(x.ranks),
            "factor": round(x.factor, 2), "out_ms": round(x.out_s * 1000, 1),
            "median_ms": round(x.median_s * 1000, 1), "slow_s": round(s.now - x.since, 1)},
            EventSpec("Warning", "WorkerSlow", "Observe", why)))
    for x in ch.over:
        pod, node = where(x.host)
        p.todo.append(Note("info", "worker.slow_over", {
            "pod": pod, "node": node, "host": x.host, "kind": x.kind,
            "factor": round(x.factor, 2)},
            EventSpec("Normal", "WorkerNoLongerSlow", "Observe",
                      f"rank {', '.join(map(str, x.ranks))} (pod {pod} on node {node}) is no "
                      f"longer slow: {stragglers.describe(x)}")))
    for x in ch.gone:
        p.todo.append(Note("info", "worker.slow_gone", {"host": x.host, "kind": x.kind}))
    over = {pod for x in ch.over if (pod := s.listed_hosts.get(x.host)) is not None}
    # pods moved already (their slot is at its next incarnation), gone, or no longer slow
    moving = {pod: why for pod, why in w.moving.items()
              if pod not in over and _current(p, s, st, pod)}
    if moving != w.moving:
        w = replace(w, moving=moving)
    for key, x in sorted(w.named.items()):
        pod, node = where(x.host)
        if pod is None or pod in w.moving or key in w.kept:
            continue
        refused = _refused(p, s, st, x, w=w, pod=pod)
        if refused is not None:
            w = replace(w, kept=w.kept | {key})
            p.todo.append(Note("info", "worker.slow_kept", {
                "pod": pod, "node": node, "host": x.host, "kind": x.kind, "reason": refused}))
            continue
        w = stragglers.moved(w, x, pod, f"slow: {stragglers.describe(x)}", s=st.slow,
                             wall=s.wall)
    if w != c.slow:
        p.c = replace(p.c, slow=w)


def _refused(p: Passing, s: Seen, st: Settings, x: stragglers.Slow, *, w: stragglers.Watch,
             pod: str) -> str | None:
    """Why the slow host `x` (pod `pod`) is not moved now, or None: it is."""
    if st.slow.moves <= 0:
        return "SUPERVISOR_SLOW_MOVES is 0: reported only"
    if p.c.fleet is None or not st.classify.graceful_leave:
        return "the supervisor does not own the workers (SUPERVISOR_WORKER_TEMPLATE is not set)"
    if not _current(p, s, st, pod):
        return "its pod is not a current worker of the job"
    if x.kind == stragglers.WORK and (again := sorted(set(x.ranks) & w.moved_ranks)):
        return (f"rank {', '.join(map(str, again))} was slow on a host moved before: the "
                "slowness follows the rank (its own work), not the host")
    if not x.pays():
        with_it, without = x.rates()
        if x.kind == stragglers.LINK:
            return (f"the world's step now ({x.step_s * 1000:.1f} ms) against its fastest "
                    f"since it formed ({x.best_s * 1000:.1f} ms) does not show that the world "
                    f"would train faster without it until a replacement joins (at least "
                    f"{stragglers.LINK_SLOWER:.0%} slower, and {len(x.ranks)} fewer ranks at "
                    "the fastest step beating all of them now)")
        return (f"the world trains faster with it ({with_it:.1f} rank-steps/s) than without it "
                f"({without:.1f}) until a replacement joins")
    if not stragglers.may_move(w, st.slow, s.wall):
        return (f"the move budget is used ({st.slow.moves} within "
                f"{st.slow.window_s:g}s)")
    return None


def _current(p: Passing, s: Seen, st: Settings, pod: str) -> bool:
    return pod in s.pods and current_slot(p.c.fleet, s.pods[pod], st.plan.job) is not None
