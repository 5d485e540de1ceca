// Package securitytest holds delayq's security tests; it has no code of its own.
//
// They prove, on real servers, what docs/SECURITY.md states: TLS (rediss://,
// sslmode=verify-full) and Redis AUTH/ACL users work through the URLs the commands
// take; the least Redis ACL of the relay and of the workers is enough for every
// script they run and refuses anything else; passwords never appear in the output
// of the commands, in their logs or in their errors; payload size limits hold on
// every enqueue path; the admin HTTP server listens on loopback unless told
// otherwise.
package securitytest
