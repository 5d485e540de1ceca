package workflow_test

import (
	"testing"

	"github.com/delayq/delayq/delayqtest"
)

func TestMain(m *testing.M) { delayqtest.Main(m) }
