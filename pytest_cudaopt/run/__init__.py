"""The run survives: supervision of children, the watchdog, the sentinel, signals, and the
zygote that forks workers with torch imported."""
