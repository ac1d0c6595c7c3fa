package cluster_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Members and watches own goroutines; every test must end them all.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
