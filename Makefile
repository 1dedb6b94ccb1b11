.PHONY: e2e s3

# End-to-end tests against a real control plane (see tests/k8s/README.md).
e2e:
	tests/k8s/run-e2e.sh

# Object-storage tests against a real S3 server, SeaweedFS built from the Go
# module proxy (see tests/scale/seaweedfs.sh).
s3:
	tests/scale/run-s3.sh
