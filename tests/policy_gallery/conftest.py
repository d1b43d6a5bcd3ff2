# The gallery holds workdirs that break the rules on purpose: tests/test_policy.py checks them
# statically; pytest must not collect their model_new.py as workdirs to run.
collect_ignore_glob = ["*"]
