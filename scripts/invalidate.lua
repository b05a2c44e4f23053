-- INVALIDATE: advance the fence, so that no rebuild in flight can write
-- its (possibly stale) value afterwards, then delete the value.
-- KEYS[1] value, KEYS[2] fence hash
-- ARGV[1] fence ttl ms
-- Returns the new fence (a decimal string).
if redis.call('HEXISTS', KEYS[2], 'n') == 0 then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[2], 'n', t[1] .. string.rep('0', 6 - #t[2]) .. t[2])
end
local n = redis.call('HINCRBY', KEYS[2], 'n', 1)
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[1]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
end
redis.call('DEL', KEYS[1])
return string.format('%d', n)
