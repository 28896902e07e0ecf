"""Untrusted execution. Modules here run inside worker processes (candidate or reference),
except `runner`, the harness's handle on a worker: spawn, private channel, deadline, kill, and
`memwatch`, its memory watchdog; `reaper` (find, kill and reap leftover processes) serves both."""
