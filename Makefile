.PHONY: e2e

# End-to-end tests against a real control plane (see tests/k8s/README.md).
e2e:
	tests/k8s/run-e2e.sh
