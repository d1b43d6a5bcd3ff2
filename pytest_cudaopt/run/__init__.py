"""The run survives: supervision, the watchdog, the sentinel, signals, and the zygote."""
