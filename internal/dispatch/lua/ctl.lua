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
--          allowed per w ms (0: no limit), b burst, g the claim script's GCRA time,
--          u the last resume (Unix ms, Redis clock: set when p goes from "1" to
--          "0"), from which the claim script measures the lateness of a task that
--          fell due while the queue was paused
-- ARGV[1]  wake channel (1..200 bytes)
-- ARGV[2]  version (1..10^15-1)
-- ARGV[3]  paused: "1" or "0"
-- ARGV[4]  rate limit: starts per period (0..10^9; 0 is no limit)
-- ARGV[5]  period in ms (1..2^40)
-- ARGV[6]  burst: starts allowed at once (1..10^9)
-- ARGV[7]  the queue's shard count (1..64), kept as n: the enqueue script refuses
--          a call routed by another count, and the claim script takes its shard's
--          share of the rate limit by it. (Every shard holds the controls.)
-- ARGV[8]  runs at once per concurrency key (0..10^5; 0 is no cap), kept as kc
-- ARGV[9]  starts per concurrency key per window (0..10^4; 0 is no throttle), kn
-- ARGV[10] the throttle's window in ms (1..2^40), kw
-- KEYS[2]  ready ZSET, KEYS[3] priority index ZSET, KEYS[4] task hash key prefix,
-- KEYS[5]  concurrency-key prefix: when kc, kn or kw change, every task parked
--          for its key (claim.lua) goes back into ready, where the next claims
--          judge it by the new caps (and park it again if they must)
--
-- Returns 1 if applied, 0 if an equal or newer version is held.
-- Malformed ARGV: an error reply, nothing written.

if #ARGV ~= 10 then return fail('expected 10 arguments, got ' .. #ARGV) end
if #ARGV[1] == 0 or #ARGV[1] > 200 then return fail('wake channel must have 1..200 bytes') end
local v = int(ARGV[2], 1, 999999999999999)
if v == nil then return fail('version must be an integer in 1..10^15-1') end
if ARGV[3] ~= '1' and ARGV[3] ~= '0' then return fail('paused must be 1 or 0') end
if int(ARGV[4], 0, 1000000000) == nil then return fail('rate limit must be an integer in 0..10^9') end
if int(ARGV[5], 1, 1099511627776) == nil then return fail('period must be an integer number of ms in 1..2^40') end
if int(ARGV[6], 1, 1000000000) == nil then return fail('burst must be an integer in 1..10^9') end
if int(ARGV[7], 1, 64) == nil then return fail('shards must be an integer in 1..64') end
if int(ARGV[8], 0, 100000) == nil then return fail('key cap must be an integer in 0..10^5') end
if int(ARGV[9], 0, 10000) == nil then return fail('key throttle must be an integer in 0..10^4') end
if int(ARGV[10], 1, 1099511627776) == nil then return fail('key window must be an integer number of ms in 1..2^40') end

-- (HMGET and HSET only: the commands the least ACLs of docs/SECURITY.md give the
-- relay and the operator.)
local f = redis.call('HMGET', KEYS[1], 'v', 'p', 'r', 'w', 'b', 'kc', 'kn', 'kw')
local held = tonumber(f[1] or '0') or 0
if held >= v then return 0 end
local limited = ARGV[4] ~= (f[3] or '0') or ARGV[5] ~= (f[4] or '1000') or ARGV[6] ~= (f[5] or '1')
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'p', ARGV[3], 'r', ARGV[4], 'w', ARGV[5], 'b', ARGV[6], 'n', ARGV[7])
if limited then redis.call('HSET', KEYS[1], 'g', '0') end
-- The caps per key: written only when set or changed, so a queue without them
-- keeps its hash as before (absent kc and kn: none).
local keys_changed = ARGV[8] ~= (f[6] or '0') or ARGV[9] ~= (f[7] or '0') or (ARGV[9] ~= '0' and ARGV[10] ~= (f[8] or '1000'))
local readmitted = 0
if keys_changed then
  redis.call('HSET', KEYS[1], 'kc', ARGV[8], 'kn', ARGV[9], 'kw', ARGV[10])
  local kp = KEYS[5]
  -- With limits the queue dispatches fairly: each key gets a head in ready (if it
  -- has none) and keeps the rest. Without, every parked task goes back.
  local fair = ARGV[8] ~= '0' or ARGV[9] ~= '0'
  for _, k in ipairs(redis.call('SMEMBERS', kp .. 'keys')) do
    readmitted = readmitted + key_admit(kp, KEYS[2], KEYS[3], KEYS[1], KEYS[4], k, 1000000000, fair)
  end
  redis.call('DEL', kp .. 'wake')
  if not fair then redis.call('DEL', kp .. 'keys', kp .. 'h', kp .. 'n') end
end
if ARGV[3] == '0' and f[2] == '1' then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[1], 'u', tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
end
if ARGV[3] == '0' and (f[2] == '1' or limited or readmitted > 0) then redis.call('PUBLISH', ARGV[1], '0') end
return 1
