-- inspect.lua: everything herd keeps in Redis for one key, read in one
-- script so that it runs on the key's master and sees one instant.
-- KEYS: value, lease, fence, failure marker, backoff, FencedStore record.
-- Returns {value, value PTTL, lease, lease PTTL, fence n, refresh
-- failures e, failure marker, marker PTTL, backoff PTTL, record token},
-- each false (nil) or a PTTL of -2 when absent. A key of a foreign type
-- reads as absent (its PTTL still tells it exists).
local function get(k)
  local t = redis.call('TYPE', k)['ok']
  if t ~= 'string' then return false end
  return redis.call('GET', k)
end
local function hget(k, f)
  local t = redis.call('TYPE', k)['ok']
  if t ~= 'hash' then return false end
  return redis.call('HGET', k, f)
end
return {
  get(KEYS[1]), redis.call('PTTL', KEYS[1]),
  get(KEYS[2]), redis.call('PTTL', KEYS[2]),
  hget(KEYS[3], 'n'), hget(KEYS[3], 'e'),
  get(KEYS[4]), redis.call('PTTL', KEYS[4]),
  redis.call('PTTL', KEYS[5]),
  hget(KEYS[6], 't'),
}
