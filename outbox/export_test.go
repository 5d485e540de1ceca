package outbox

// EnqueueManyStatement is the SQL of EnqueueMany, for tests of its plan.
func (c *Client) EnqueueManyStatement() string { return c.sql.enqueueMany }
