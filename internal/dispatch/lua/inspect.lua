-- inspect: a consistent read of some tasks of one queue. Reads only.
--
-- KEYS[1]  ready ZSET
-- KEYS[2]  active ZSET
-- KEYS[3]  dead ZSET
-- KEYS[4]  task hash key prefix
-- ARGV[1..n]  task ids (1..1000 of them, each 1..200 bytes)
--
-- Returns n groups of 9: status ("r" ready, "a" active, "d" done, "x" dead, or "" when
-- the hash does not exist), payload, attempt, max_attempts, version, last error,
-- score (the due time in ready, lease deadline in active, time of death in dead; ""
-- when the id is in no ZSET), ttl in ms (-1 none, -2 no hash), priority ("" for 0).
-- Missing fields are "". Malformed ARGV: an error reply.

if #ARGV < 1 or #ARGV > 1000 then return fail('expected 1..1000 ids, got ' .. #ARGV) end
for i = 1, #ARGV do
  if #ARGV[i] == 0 or #ARGV[i] > 200 then return fail('id ' .. i .. ' must have 1..200 bytes') end
end

local out = {}
for _, id in ipairs(ARGV) do
  local h = KEYS[4] .. id
  local f = redis.call('HMGET', h, 's', 'p', 'a', 'm', 'v', 'e', 'y')
  -- Fields at their defaults are absent (Keys.TaskKey); report their values.
  f[1] = f[1] or (f[2] and 'r')
  if f[1] then
    f[5] = f[5] or '1'
    if f[1] ~= 'd' then f[4] = f[4] or '25' end
  end
  local score = redis.call('ZSCORE', KEYS[1], id) or redis.call('ZSCORE', KEYS[2], id)
    or redis.call('ZSCORE', KEYS[3], id) or ''
  local k = #out
  for j = 1, 6 do out[k + j] = f[j] or '' end
  out[k + 7] = score
  out[k + 8] = redis.call('PTTL', h)
  out[k + 9] = f[7] or ''
end
return out
