-- INVALIDATE: advance the fence, so that no rebuild in flight can write
-- its (possibly stale) value afterwards, then delete the value.
-- KEYS[1] value, KEYS[2] fence hash
-- ARGV[1] fence ttl ms
-- Returns the new fence (a decimal string).
-- The fence is max(counter + 1, the server's clock in µs), as in ACQUIRE.
local t = redis.call('TIME')
local n = math.max((tonumber(redis.call('HGET', KEYS[2], 'n')) or 0) + 1, t[1] * 1000000 + t[2])
redis.call('HSET', KEYS[2], 'n', string.format('%d', n))
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[1]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
end
redis.call('DEL', KEYS[1])
return string.format('%d', n)
