"""A runtime's connection to its node, and what happens when requests fail (a mixin of
genie.runtime.Runtime).

- `connection()` connects on first use (and after a loss); a new connection clears the graph
  cache (graphs are registered per session) and decides whether asynchronous runs pay
  (`genie.runtime.async_chunk_for`).
- `_request(method, *args)` is one request that waits for its reply. A lost node
  (GenieConnectionError) marks every value of the session lost (`_lost`); with host copies kept
  (`genie.init(keep_host_copy=True)`) it is recovered instead (`_recover`: connect again, replay
  the lineage, send the request again). Ctrl-C while a request waits takes effect once the books
  agree with the node (`_raise_interrupt`).
- `_call` is `_request` plus the report of failed asynchronous runs (`_reap_async`): a failed
  run poisons the runs sent after it, as a CUDA error does the work queued behind it.
"""

from __future__ import annotations

import time
import warnings

from .errors import GenieConnectionError, GenieError, GenieRemoteError
from .graph import Value
from .lineage import Lineage


class Connection:
    """The connection policy of one runtime (see the module docstring)."""

    # Recovery (`lineage` set): how long a lost node may take to come back (s), and how many
    # times one request may be recovered (a request that kills every node it reaches).
    recovery_timeout_s = 60.0
    max_recoveries = 3

    def __init__(self, connect, keep_host_copy: bool) -> None:
        self._connect = connect  # () -> genie._C.Client
        self.client = None
        # Counts the node sessions this runtime opened, and its close: what a graph registered
        # outside the recording (a compiled part's, genie.compile) belongs to.
        self.session_serial = 0
        # The requests that made the resident state, to rebuild it on a new node (None: off).
        self.lineage: Lineage | None = Lineage() if keep_host_copy else None
        self._interrupt: KeyboardInterrupt | None = None  # see _request
        # Asynchronous runs (their ids and kept values, the deferred error) are the C++ runtime's
        # (self.native); with a lineage: request id -> its lineage entry.
        self._lineage_entry: dict[int, int] = {}

    def connection(self):
        if self.client is None:
            self._check_not_forked()  # the client was the parent's (genie.runtime._after_fork_in_child)
            self.client = self._connect()
            self.native.attach(self.client)
            self.session_serial += 1
            self.recording.clear_graphs()
            self.recording.async_chunk = self._async_chunk_for(self.client)
            self.recording.connected = True
            self.recording.cpu_kernels = str(self.client.device) == "cpu"
            self._forget_rng_state()
        return self.client

    def _lost(self, error: BaseException) -> None:
        """The node went away: every value of the session is lost; the next call reconnects."""
        self.recording.mark_lost(error)
        self.recording.connected = False
        self.native.forget_in_flight()  # the deferred error too: superseded by the connection error
        self._lineage_entry = {}
        if self.lineage is not None:
            self.lineage = Lineage()  # of handles that are gone with the node
        self._drop_client()

    def _drop_client(self) -> None:
        """Closes the client of a lost connection (already gone: nothing to report)."""
        client, self.client = self.client, None
        self.native.detach()
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - already gone
                pass

    def _recover(self, error: GenieConnectionError) -> bool:
        """With a lineage: connects again (the node restarted at its address, or a restarted
        embedded node; for up to `recovery_timeout_s`) and replays the lineage on the new
        session. True when the state is rebuilt; False (the values are then lost) otherwise."""
        if self.lineage is None:
            return False
        self._drop_client()
        deadline = time.monotonic() + self.recovery_timeout_s
        while True:
            try:
                # Not connection(): the graph cache stays (graph ids are content hashes).
                client = self._connect()
                self.lineage.replay(client)
            except GenieConnectionError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.25)
                continue
            except GenieError as replay_error:  # the new node refused the state (out of memory, ...)
                warnings.warn(f"genie: {self.device}: rebuilding the lost state failed: {replay_error}", stacklevel=4)
                return False
            self.client = client
            self.native.attach(client)
            self.native.forget_in_flight()  # replayed; their failures were checked there
            warnings.warn(f"genie: {self.device}: the node was lost ({error}); reconnected to {client.address} "
                          f"and rebuilt the resident state from {len(self.lineage.entries)} logged requests",
                          stacklevel=4)
            return True

    def _request(self, method: str, *args, _recoveries: int = 0):
        """One request to the node that waits for its reply."""
        client = self.connection()
        returned_before = client.completed_calls
        try:
            result = getattr(client, method)(*args)
        except GenieConnectionError as error:
            if _recoveries < self.max_recoveries and self._recover(error):
                return self._request(method, *args, _recoveries=_recoveries + 1)
            self._lost(error)
            raise
        except KeyboardInterrupt as interrupt:
            if client.completed_calls == returned_before:
                raise
            # Ctrl-C while the call waited (without the GIL): Python raises it as the call
            # returns, after the node did the work. The books are kept with the call's result
            # (the client records it) and the interrupt is raised once they agree with the
            # node (`_raise_interrupt`), as a local program's state survives Ctrl-C.
            self._interrupt = interrupt
            result, client.last_result = client.last_result, None
            return result
        # No tensor kept longer than the caller keeps it. Setting a C++ attribute runs no
        # bytecode, where Python would raise a pending interrupt, so none lands before it.
        client.last_result = None
        return result

    def _raise_interrupt(self) -> None:
        """Raises the KeyboardInterrupt `_request` held back, if any."""
        interrupt, self._interrupt = self._interrupt, None
        if interrupt is not None:
            raise interrupt

    def _call(self, method: str, *args):
        """`_request`, then the report of failed asynchronous runs: the first one's error is
        raised (after the request's own error, if it failed too: `raise ... from`)."""
        try:
            result = self._request(method, *args)
        except GenieRemoteError as error:
            failed = self._reap_async()
            if failed is not None:
                raise failed from error
            raise
        self._raise_interrupt()
        failed = self._reap_async()
        if failed is not None:
            raise failed
        return result

    def _reap_async(self, sent_after: list[Value] = ()) -> BaseException | None:
        """After a request that waited, every asynchronous run sent before it has finished.
        Returns the first failure (or an error deferred by an asynchronous run), else None
        (DeviceRuntime.reap_async).

        A failed run poisons what was sent after it, as a CUDA error does the work queued
        behind it: the values it and every later run would have kept (and `sent_after`, those
        of the request that just waited) are lost with its error. Later runs may have read
        storage the failed run was to write, so their results cannot be trusted."""
        return self.native.reap_async(list(sent_after))

    def _connection_failed(self, error: GenieConnectionError, attempt: int) -> bool:
        """The C++ runtime's request lost the node (`attempt`: recoveries of this request so far):
        True when recovered (it sends the request again), else every value is lost (False)."""
        if attempt < self.max_recoveries and self._recover(error):
            return True
        self._lost(error)
        return False
