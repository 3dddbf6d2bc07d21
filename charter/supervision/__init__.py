"""charter.supervision: pure supervision. Observations of live workers, baselines per
task class learned from completed ones, the operator's policy and ``decide``, and
honeytokens. No journal, no host: the cell samples, decides with these, appends the
verdict and acts on the committed entry (docs/supervision.md)."""

from charter.supervision.baseline import LEARNED_OUTCOME, SIGMAS, Baseline, band_upper, learn
from charter.supervision.errors import (
    BaselineClassError,
    CanaryMismatchError,
    CanaryNonceError,
)
from charter.supervision.events import (
    SUPERVISION_EVENTS,
    Action,
    BandStats,
    BaselineChanged,
    CanariesPlanted,
    Evidence,
    KillVerdict,
    PauseVerdict,
    QuarantineVerdict,
    ResumeVerdict,
    ThrottleVerdict,
    Verdict,
    WorkerProfiled,
    WorkerSampled,
    WorkspaceDigested,
    baseline_stream,
    supervise_stream,
)
from charter.supervision.honeytokens import (
    CREDENTIAL_DIR,
    CanaryKind,
    CanarySet,
    CanaryTouch,
    canaries_for,
    touched,
)
from charter.supervision.observation import Observation, Signal, Signals, observe
from charter.supervision.policy import (
    DEFAULT_RULES,
    Rule,
    Standing,
    Supervised,
    SupervisionPolicy,
    decide,
    standing_after,
    supervised_after,
)

__all__ = [
    # observations
    "Observation",
    "Signal",
    "Signals",
    "observe",
    # baselines
    "Baseline",
    "LEARNED_OUTCOME",
    "SIGMAS",
    "band_upper",
    "learn",
    # the policy and decide
    "DEFAULT_RULES",
    "Rule",
    "Standing",
    "Supervised",
    "SupervisionPolicy",
    "decide",
    "standing_after",
    "supervised_after",
    # honeytokens
    "CREDENTIAL_DIR",
    "CanaryKind",
    "CanarySet",
    "CanaryTouch",
    "canaries_for",
    "touched",
    # events
    "SUPERVISION_EVENTS",
    "Action",
    "BandStats",
    "BaselineChanged",
    "CanariesPlanted",
    "Evidence",
    "KillVerdict",
    "PauseVerdict",
    "QuarantineVerdict",
    "ResumeVerdict",
    "ThrottleVerdict",
    "Verdict",
    "WorkerProfiled",
    "WorkerSampled",
    "WorkspaceDigested",
    "baseline_stream",
    "supervise_stream",
    # errors
    "BaselineClassError",
    "CanaryMismatchError",
    "CanaryNonceError",
]
