"""An OpenEnv environment for the addition task, served with OpenEnv's own `create_app`.

    python -m examples.openenv.server --port 8011

`reset()` poses "a+b=" with a and b in 0..49, drawn from the session's seeded generator or given as `a=` and `b=`
(so a trainer can pose the dataset's own problem); `step()` takes the answer text and ends the episode with partial
credit: 1 - |answer - (a+b)| / 10, floored at 0, and 0 for anything that is not a whole number. Every WebSocket
session (`/ws`) gets an environment of its own; it listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import itertools
import random
import re
import uuid
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_app

HOST = "127.0.0.1"
NUMBER = re.compile(r"[+-]?\d+")


class AdditionAction(Action):
    answer: str  # the model's completion text


class AdditionObservation(Observation):
    prompt: str  # "a+b=", what the model is asked
    feedback: str = ""  # after the step: how the answer did


class AdditionState(State):
    a: int | None = None
    b: int | None = None


def score(answer: str, target: int) -> float:
    """Partial credit for a whole number near the target; 0 for anything else."""
    text = answer.strip()
    if not NUMBER.fullmatch(text):
        return 0.0
    return max(0.0, 1.0 - abs(int(text) - target) / 10)


class AdditionEnvironment(Environment[AdditionAction, AdditionObservation, AdditionState]):
    SUPPORTS_CONCURRENT_SESSIONS = True  # no state is shared between instances

    def __init__(self, seed: int = 0):
        super().__init__()
        self._rng = random.Random(seed)
        self._state = AdditionState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, a: int | None = None, b: int | None = None,
              **kwargs: Any) -> AdditionObservation:
        if seed is not None:
            self._rng = random.Random(seed)
        a = self._rng.randrange(50) if a is None else int(a)
        b = self._rng.randrange(50) if b is None else int(b)
        self._state = AdditionState(episode_id=episode_id or uuid.uuid4().hex, step_count=0, a=a, b=b)
        return AdditionObservation(prompt=f"{a}+{b}=")

    def step(self, action: AdditionAction, timeout_s: float | None = None, **kwargs: Any) -> AdditionObservation:
        st = self._state
        if st.a is None or st.b is None or st.step_count > 0:
            raise RuntimeError("no open episode: call reset() before step()")
        st.step_count += 1
        target = st.a + st.b
        reward = score(action.answer, target)
        feedback = "correct" if reward == 1.0 else f"expected {target}"
        return AdditionObservation(prompt=f"{st.a}+{st.b}=", feedback=feedback, reward=reward, done=True)

    @property
    def state(self) -> AdditionState:
        return self._state


def build_app(seed: int = 0, max_sessions: int = 8):
    """The FastAPI app: each new session's environment is seeded seed, seed + 1, ..."""
    seeds = itertools.count(seed)
    return create_app(lambda: AdditionEnvironment(next(seeds)), AdditionAction, AdditionObservation, env_name="addition",
                      max_concurrent_envs=max_sessions)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Serve the addition environment over OpenEnv (on 127.0.0.1).")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--seed", type=int, default=0, help="seed of the first session's generator")
    parser.add_argument("--max-sessions", type=int, default=8, help="concurrent WebSocket sessions")
    args = parser.parse_args(argv)
    uvicorn.run(build_app(args.seed, args.max_sessions), host=HOST, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
