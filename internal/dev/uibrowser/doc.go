// Package uibrowser holds the dashboard's browser tests: a headless Chromium
// (chromedp) drives the pages of internal/ui the way an operator does. They live
// in the dev module so that chromedp stays out of the root module's go.mod, and
// so out of every user's go.sum.
package uibrowser
