"""Typed exceptions: one per executor error kind (DESIGN §2), and the client's own
failures (no binary, no connection, a client-side timeout)."""

from __future__ import annotations

from ._types import Observation


class AirlockError(Exception):
    """Base of every error this package raises."""

    kind: str = "internal"

    def __init__(
        self,
        message: str,
        *,
        observation: Observation | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.observation = observation
        """The error observation, when airlock sent one (it has the job id)."""
        self.status = status
        """The HTTP status, in remote mode."""


class InvalidInput(AirlockError):
    """The request is malformed (HTTP 400/413)."""

    kind = "invalid_input"


class SessionNotFound(InvalidInput):
    """No such session for this token: it ended (deleted, past its ttl or idle time, the
    server restarted), or it belongs to another tenant."""


class PolicyDenied(AirlockError):
    """The request asks for more than the policy allows (HTTP 403)."""

    kind = "policy_denied"


class Unauthorized(AirlockError):
    """No valid bearer token (HTTP 401)."""

    kind = "unauthorized"


class BackendUnavailable(AirlockError):
    """The backend cannot run jobs now, or the server's queue is full (HTTP 503/429)."""

    kind = "backend_unavailable"

    def __init__(
        self,
        message: str,
        *,
        observation: Observation | None = None,
        status: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, observation=observation, status=status)
        self.retry_after_s = retry_after_s
        """The server's Retry-After, when it sent one (429)."""


class InternalError(AirlockError):
    """airlock itself failed (HTTP 500), or the job was interrupted by a shutdown."""

    kind = "internal"


class TransportError(AirlockError):
    """The client could not talk to airlock: no binary, no connection, or an answer that
    is not airlock's."""

    kind = "transport"


class BinaryNotFound(TransportError):
    """No `airlock` binary: set AIRLOCK_BIN, install the wheel, or use AIRLOCK_URL."""


class ClientTimeout(TransportError, TimeoutError):
    """The client gave up waiting, past the job's own wall time plus the margin."""


_BY_KIND: dict[str, type[AirlockError]] = {
    cls.kind: cls for cls in (InvalidInput, PolicyDenied, Unauthorized, BackendUnavailable)
}


def error_for(
    kind: str,
    message: str,
    *,
    observation: Observation | None = None,
    status: int | None = None,
    retry_after_s: float | None = None,
) -> AirlockError:
    """The exception for an error kind. A 401 is `Unauthorized` whatever kind it names
    (servers before the `unauthorized` kind called it `policy_denied`)."""
    if status == 401:
        return Unauthorized(message, observation=observation, status=status)
    cls = _BY_KIND.get(kind, InternalError)
    if cls is BackendUnavailable:
        return BackendUnavailable(
            message, observation=observation, status=status, retry_after_s=retry_after_s
        )
    return cls(message, observation=observation, status=status)


def raise_for_observation(observation: Observation, *, status: int | None = None) -> None:
    """Raises the typed error of an `error` observation; returns for any job that ran."""
    if observation.outcome != "error":
        return
    kind = observation.error.kind if observation.error else "internal"
    message = observation.error.message if observation.error else "the job could not run"
    raise error_for(kind, message, observation=observation, status=status)
