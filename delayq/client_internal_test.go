package delayq

// clientOf wraps a worker the tests built by hand, for the typed registrations.
func clientOf(w *worker) *Client { return &Client{w: w} }
