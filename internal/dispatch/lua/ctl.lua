-- ctl: set the controls of one queue (its pause flag and rate limit), mirrored
-- from Postgres.
--
-- The controls are keyed by their version in Postgres (delayq_queues.version): a
-- call with a version not newer than the one held changes nothing, so a late
-- mirror write never undoes a newer pause, resume or limit. A resume, or a rate
-- limit that changed, publishes on the wake channel, so that workers asleep on the
-- queue claim at once. A changed limit also restarts the limiter's state (g, which
-- the claim script keeps): a start time earned under the old limit is not owed
-- under the new one.
--
-- KEYS[1]  ctl HASH: v version, p "1" while paused ("0" once resumed), r starts
--          allowed per w ms (0: no limit), b burst, g the claim script's GCRA time
-- ARGV[1]  wake channel (1..200 bytes)
-- ARGV[2]  version (1..10^15-1)
-- ARGV[3]  paused: "1" or "0"
-- ARGV[4]  rate limit: starts per period (0..10^9; 0 is no limit)
-- ARGV[5]  period in ms (1..2^40)
-- ARGV[6]  burst: starts allowed at once (1..10^9)
-- ARGV[7]  the queue's shard count (1..64), kept as n: the enqueue script refuses
--          a call routed by another count, and the claim script takes its shard's
--          share of the rate limit by it. (Every shard holds the controls.)
--
-- Returns 1 if applied, 0 if an equal or newer version is held.
-- Malformed ARGV: an error reply, nothing written.

if #ARGV ~= 7 then return fail('expected 7 arguments, got ' .. #ARGV) end
if #ARGV[1] == 0 or #ARGV[1] > 200 then return fail('wake channel must have 1..200 bytes') end
local v = int(ARGV[2], 1, 999999999999999)
if v == nil then return fail('version must be an integer in 1..10^15-1') end
if ARGV[3] ~= '1' and ARGV[3] ~= '0' then return fail('paused must be 1 or 0') end
if int(ARGV[4], 0, 1000000000) == nil then return fail('rate limit must be an integer in 0..10^9') end
if int(ARGV[5], 1, 1099511627776) == nil then return fail('period must be an integer number of ms in 1..2^40') end
if int(ARGV[6], 1, 1000000000) == nil then return fail('burst must be an integer in 1..10^9') end
if int(ARGV[7], 1, 64) == nil then return fail('shards must be an integer in 1..64') end

-- (HMGET and HSET only: the commands the least ACLs of docs/SECURITY.md give the
-- relay and the operator.)
local f = redis.call('HMGET', KEYS[1], 'v', 'p', 'r', 'w', 'b')
local held = tonumber(f[1] or '0') or 0
if held >= v then return 0 end
local limited = ARGV[4] ~= (f[3] or '0') or ARGV[5] ~= (f[4] or '1000') or ARGV[6] ~= (f[5] or '1')
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'p', ARGV[3], 'r', ARGV[4], 'w', ARGV[5], 'b', ARGV[6], 'n', ARGV[7])
if limited then redis.call('HSET', KEYS[1], 'g', '0') end
if ARGV[3] == '0' and (f[2] == '1' or limited) then redis.call('PUBLISH', ARGV[1], '0') end
return 1
