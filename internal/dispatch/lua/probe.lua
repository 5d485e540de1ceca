-- probe: an atomic read of some tasks of one queue, hash and ZSET memberships
-- together, for reconcile and the consistency check. Reads only.
--
-- KEYS[1]  ready ZSET
-- KEYS[2]  active ZSET
-- KEYS[3]  dead ZSET
-- KEYS[4]  task hash key prefix
-- KEYS[5]  concurrency-key prefix: a task parked for its key (claim.lua) reads
--          as ready, with its parked score as its ready score
-- ARGV[1..n]  task ids (1..1000 of them, each 1..200 bytes)
--
-- Returns { now, then n groups of 8:
--           status, version, attempt, max_attempts,
--           ready score, active score, dead score, fingerprint }
--   now          the Redis clock, Unix seconds with 3 decimals (string)
--   status       "r" ready, "a" active, "d" done, "x" dead, "" no hash
--   scores       "" when the id is not a member of that ZSET
--   fingerprint  an opaque string that changes with any of the above (and with the
--                lease token); repair.lua acts only while it is unchanged
-- Missing fields are "". Malformed ARGV: an error reply.

-- Keep read() identical in repair.lua: the fingerprints must match.
local function read(id, kp)
  local f = redis.call('HMGET', KEYS[4] .. id, 's', 'v', 'a', 'm', 't', 'k')
  -- Fields at their defaults are absent (Keys.TaskKey); report their values.
  if f[1] == false and redis.call('HEXISTS', KEYS[4] .. id, 'p') == 1 then f[1] = 'r' end
  if f[1] then
    f[2] = f[2] or '1'
    if f[1] ~= 'd' then f[4] = f[4] or '25' end
  end
  local rs = redis.call('ZSCORE', KEYS[1], id) or ''
  -- A task parked for its concurrency key (claim.lua) is ready, at its score.
  if rs == '' and f[6] then rs = redis.call('ZSCORE', kp .. 'p:' .. f[6], id) or '' end
  local as = redis.call('ZSCORE', KEYS[2], id) or ''
  local ds = redis.call('ZSCORE', KEYS[3], id) or ''
  local s, v, a, m, t = f[1] or '', f[2] or '', f[3] or '', f[4] or '', f[5] or ''
  return { s, v, a, m, rs, as, ds, table.concat({ s, v, a, m, t, rs, as, ds }, '|') }
end

if #ARGV < 1 or #ARGV > 1000 then return fail('expected 1..1000 ids, got ' .. #ARGV) end
for i = 1, #ARGV do
  if #ARGV[i] == 0 or #ARGV[i] > 200 then return fail('id ' .. i .. ' must have 1..200 bytes') end
end

local t = redis.call('TIME')
local out = { fmt(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)) }
for _, id in ipairs(ARGV) do
  local g = read(id, KEYS[5])
  for j = 1, 8 do out[#out + 1] = g[j] end
end
return out
