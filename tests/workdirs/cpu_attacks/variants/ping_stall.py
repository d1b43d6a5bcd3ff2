
# ping_stall (appended to timer_patch.py: its 100 ms a call hidden behind a patched perf_counter):
# the worker also answers every ping 40 ms late once it is loaded. The judging process sizes the
# handoff it forgives from those pings, so slow pings would widen the allowance past what it hides.
import sys

_server = sys.modules.get("pytest_cudaopt.candidate.serve")
if _server is not None:
    _ping = _server.Server.op_ping

    def _slow_ping(self, request):
        time.sleep(40e-3)
        return _ping(self, request)

    _server.Server.op_ping = _slow_ping
