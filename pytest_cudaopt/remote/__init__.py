"""The judging side of the wire: the Candidate Protocol, RemoteModel, the worker's life, the timed window, timing."""
