-- workerbye: a worker process's goodbye: it leaves the process registry
-- (Client.ByeWorker; see workerbeat.lua for the keys).
--
-- KEYS[1]  the index ZSET
-- KEYS[2]  the prefix of the process HASH keys
-- ARGV[1]  process id (1..64 bytes)
--
-- Returns 1 when the process was registered, else 0.
-- Malformed ARGV: an error reply, nothing written.

if #ARGV ~= 1 or #ARGV[1] == 0 or #ARGV[1] > 64 then return fail('expected a process id of 1..64 bytes') end
redis.call('ZREM', KEYS[1], ARGV[1])
return redis.call('DEL', KEYS[2] .. ARGV[1])
