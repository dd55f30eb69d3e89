"""Interactive sessions from a generator whose parameters live in ``interactive.toml``.

Every draw of times and stretches comes from one ``random.Random(seed)``, the sessions'
memory peaks from a second stream of the same seed: the same file and seed give the same
sessions, whichever policy replays them.
"""

from __future__ import annotations

import math
import random
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from .workload import Session, Stretch

DEFAULTS = Path(__file__).with_name("interactive.toml")
DAY = 86400.0


class ParameterError(ValueError):
    pass


def load_parameters(path: Path | None = None) -> dict[str, Any]:
    """The defaults, overlaid with ``path`` (a partial file changes only what it names)."""
    params = tomllib.loads(DEFAULTS.read_text())
    if path is not None:
        try:
            given = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ParameterError(f"{path}: not TOML ({e})") from None
        except OSError as e:
            raise ParameterError(f"{path}: cannot read it ({e.strerror or e})") from None
        for section, values in given.items():
            if section not in params or not isinstance(values, dict):
                raise ParameterError(f"{path}: unknown section [{section}]")
            unknown = set(values) - set(params[section]) if section != "profiles" else set()
            if unknown:
                raise ParameterError(f"{path}: unknown key {section}.{sorted(unknown)[0]}")
            params[section] = values if section == "profiles" else {**params[section], **values}
    _check(params)
    return params


def _check(p: dict[str, Any]) -> None:
    hourly = p["arrivals"]["hourly"]
    if len(hourly) != 24 or any(h < 0 for h in hourly) or not sum(hourly):
        raise ParameterError("arrivals.hourly must be 24 weights >= 0, not all 0")
    if not p["profiles"] or any(w < 0 for w in p["profiles"].values()):
        raise ParameterError("profiles must give each profile a weight >= 0")
    s = p["stretches"]
    if not 0 < s["busy_min"] <= s["busy_max"] <= 1:
        raise ParameterError("stretches: need 0 < busy_min <= busy_max <= 1")
    for key in ("left_running_share",):
        if not 0 <= p["session"][key] <= 1:
            raise ParameterError(f"session.{key} must be from 0 to 1")
    if not 0 <= s["silent_share"] <= 1:
        raise ParameterError("stretches.silent_share must be from 0 to 1")
    m = p["memory"]
    if not 0 < m["peak_median_share"] <= 1:
        raise ParameterError("memory.peak_median_share must be > 0 and at most 1")
    if m["user_sigma"] < 0 or not 0 <= m["session_jitter"] < 1:
        raise ParameterError("memory: need user_sigma >= 0 and 0 <= session_jitter < 1")


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def generate(
    params: dict[str, Any],
    days: float,
    seed: int,
    profile_milli: dict[str, int],
    first_id: int = 0,
) -> list[Session]:
    """Sessions arriving over ``days``. ``profile_milli``: each profile's GPU share, so a
    stretch keeps a share of what its profile holds busy."""
    rng = random.Random(seed)
    pop, arr, ses, st = (
        params["population"],
        params["arrivals"],
        params["session"],
        params["stretches"],
    )
    unknown = set(params["profiles"]) - set(profile_milli)
    if unknown:
        raise ParameterError(f"profiles: unknown profile {sorted(unknown)[0]!r}")
    names = list(params["profiles"])
    weights = [params["profiles"][n] for n in names]
    hourly = arr["hourly"]
    hour_share = [h / sum(hourly) for h in hourly]
    sessions: list[Session] = []
    for day in range(math.ceil(days)):
        weekday = (arr["start_weekday"] + day) % 7
        per_user = arr["sessions_per_user_weekday"] * (arr["weekend_factor"] if weekday >= 5 else 1)
        for hour in range(24):
            start = day * DAY + hour * 3600.0
            if start >= days * DAY:
                break
            mean = pop["users"] * per_user * hour_share[hour]
            for _ in range(_poisson(rng, mean)):
                user = rng.randrange(pop["users"])
                profile = rng.choices(names, weights)[0]
                sessions.append(
                    Session(
                        id=first_id + len(sessions),
                        user=f"user{user:04d}",
                        group=f"group{user % pop['groups']:02d}",
                        arrival=start + rng.random() * 3600.0,
                        profile=profile,
                        stretches=draw_stretches(rng, ses, st, profile_milli[profile]),
                    )
                )
    sessions.sort(key=lambda s: (s.arrival, s.id))
    peaks = memory_peaks(params["memory"], seed, [s.user for s in sessions])
    return [
        replace(s, id=first_id + i, peak_memory_share=peak)
        for i, (s, peak) in enumerate(zip(sessions, peaks, strict=True))
    ]


def memory_peaks(mem: dict[str, Any], seed: int, users: list[str]) -> list[float]:
    """Each session's peak memory share (see ``[memory]`` in interactive.toml), from a
    random stream of its own so the rest of the workload does not move with it."""
    rng = random.Random(f"memory-{seed}")
    habit: dict[str, float] = {}
    out = []
    for user in users:
        if user not in habit:
            habit[user] = min(1.0, _lognormal(rng, mem["peak_median_share"], mem["user_sigma"]))
        jitter = rng.uniform(-mem["session_jitter"], mem["session_jitter"])
        out.append(round(min(1.0, max(0.01, habit[user] * (1 + jitter))), 4))
    return out


def draw_stretches(
    rng: random.Random, ses: dict[str, Any], st: dict[str, Any], milli: int
) -> tuple[Stretch, ...]:
    length = min(
        _lognormal(rng, ses["length_median_hours"] * 3600, ses["length_sigma"]),
        ses["length_max_hours"] * 3600,
    )
    out: list[Stretch] = []
    used, active = 0.0, True
    while used < length:
        median = st["active_median_minutes"] if active else st["idle_median_minutes"]
        seconds = min(max(_lognormal(rng, median * 60, st["sigma"]), 60.0), length - used)
        if active:
            busy = max(1, round(milli * rng.uniform(st["busy_min"], st["busy_max"])))
            out.append(Stretch(seconds, busy, visible=rng.random() >= st["silent_share"]))
        else:
            out.append(Stretch(seconds))
        used += seconds
        active = not active
    if rng.random() < ses["left_running_share"]:
        # the person leaves without stopping the server: it idles until stopped next day
        out.append(Stretch(_lognormal(rng, ses["left_running_median_hours"] * 3600, 0.4)))
    return tuple(out)


def _poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw (Knuth's method; the means here are small)."""
    if mean <= 0:
        return 0
    if mean > 30:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
