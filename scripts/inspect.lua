-- inspect.lua: everything herd keeps in Redis for one key, read in one
-- script so that it runs on the key's master and sees one instant.
-- KEYS: value, lease, fence, failure marker, backoff, FencedStore record.
-- Returns {value, value PTTL, lease, lease PTTL, fence n, refresh
-- failures e, failure marker, marker PTTL, backoff PTTL, record token},
-- each false (nil) or a PTTL of -2 when absent. A value key of a
-- foreign type is {its type}; any other key of a foreign type reads as
-- absent (herd's scripts drop it on their next write).
local function get(k)
  local t = redis.call('TYPE', k)['ok']
  if t ~= 'string' then return false end
  return redis.call('GET', k)
end
-- The value: its bytes, false when absent, or {type} for a foreign type.
local function value(k)
  local t = redis.call('TYPE', k)['ok']
  if t == 'none' then return false end
  if t ~= 'string' then return {t} end
  return redis.call('GET', k)
end
local function hget(k, f)
  local t = redis.call('TYPE', k)['ok']
  if t ~= 'hash' then return false end
  return redis.call('HGET', k, f)
end
return {
  value(KEYS[1]), redis.call('PTTL', KEYS[1]),
  get(KEYS[2]), redis.call('PTTL', KEYS[2]),
  hget(KEYS[3], 'n'), hget(KEYS[3], 'e'),
  get(KEYS[4]), redis.call('PTTL', KEYS[4]),
  redis.call('PTTL', KEYS[5]),
  hget(KEYS[6], 't'),
}
