package main

import (
	"testing"

	"github.com/delayq/delayq/internal/testenv"
)

// TestMain shares the test servers of the package's tests and checks for leaked
// goroutines at the end.
func TestMain(m *testing.M) { testenv.Main(m) }
