-- ctl: set the controls of one queue (its pause flag), mirrored from Postgres.
--
-- The controls are keyed by their version in Postgres (delayq_queues.version): a
-- call with a version not newer than the one held changes nothing, so a late
-- mirror write never undoes a newer pause or resume. A resume publishes on the
-- wake channel, so that workers asleep on the paused queue claim at once.
--
-- KEYS[1]  ctl HASH: v version, p "1" while paused ("0" once resumed)
-- ARGV[1]  wake channel (1..200 bytes)
-- ARGV[2]  version (1..10^15-1)
-- ARGV[3]  paused: "1" or "0"
--
-- Returns 1 if applied, 0 if an equal or newer version is held.
-- Malformed ARGV: an error reply, nothing written.

if #ARGV ~= 3 then return fail('expected 3 arguments, got ' .. #ARGV) end
if #ARGV[1] == 0 or #ARGV[1] > 200 then return fail('wake channel must have 1..200 bytes') end
local v = int(ARGV[2], 1, 999999999999999)
if v == nil then return fail('version must be an integer in 1..10^15-1') end
if ARGV[3] ~= '1' and ARGV[3] ~= '0' then return fail('paused must be 1 or 0') end

-- (HMGET and HSET only: the commands the least ACLs of docs/SECURITY.md give the
-- relay and the operator.)
local f = redis.call('HMGET', KEYS[1], 'v', 'p')
local held = tonumber(f[1] or '0') or 0
if held >= v then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'p', ARGV[3])
if ARGV[3] == '0' and f[2] == '1' then redis.call('PUBLISH', ARGV[1], '0') end
return 1
