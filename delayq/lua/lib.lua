-- lib: the helpers every delayq script starts with. scriptSource (client.go) puts
-- them in front of each script, after a line `local SCRIPT = '<name>'`; this file is
-- not a script of its own.

-- fail is the error reply to a malformed call, which has written nothing.
local function fail(msg) return redis.error_reply('ERR delayq ' .. SCRIPT .. ': ' .. msg) end

-- int reads s as a decimal integer in min..max; nil when it is not one.
local function int(s, min, max)
  if type(s) ~= 'string' or not string.match(s, '^%d+$') then return nil end
  local n = tonumber(s)
  if n < min or n > max then return nil end
  return n
end

-- fmt writes a time in Unix milliseconds as Unix seconds with 3 decimals (scores,
-- and times in replies).
local function fmt(ms) return string.format('%d.%03d', math.floor(ms / 1000), ms % 1000) end

