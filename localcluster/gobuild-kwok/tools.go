//go:build tools

// Package gobuildkwok only pins the kwok controller built by localcluster/build-binaries.sh.
package gobuildkwok

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
