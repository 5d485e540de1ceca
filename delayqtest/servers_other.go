//go:build !unix

package delayqtest

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Outside Unix systems New starts no servers: the URLs must be set.

var errNoLocal = errors.New("no local servers on this system")

func localPostgres(context.Context) (string, error) { return "", errNoLocal }
func localRedis(context.Context) (string, error)    { return "", errNoLocal }
func stopLocal()                                    {}

func noServers(error) string {
	return fmt.Sprintf("delayqtest: no servers to test against: set %s and %s (or Options) to servers tests may use",
		EnvPostgresURL, EnvRedisURL)
}

const startTimeout = time.Minute
