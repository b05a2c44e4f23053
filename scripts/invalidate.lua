-- INVALIDATE: advance the fence, so that no rebuild in flight can write
-- its (possibly stale) value afterwards, then delete the value.
-- KEYS[1] value, KEYS[2] fence hash, KEYS[3] this write's marker
-- ARGV[1] fence ttl ms, ARGV[2] marker ttl ms, optional ARGV[3] the
-- near-cache channel ('' or absent: none) and ARGV[4] the key's hash tag T
-- Returns the new fence (a decimal string).
-- It also PUBLISHes T and the new fence on the near-cache channel (classic
-- PUBLISH, even on a Cluster): every process drops its near copy.
--
-- The marker makes a retry a no-op (see set.lua): a retried Invalidate must
-- not delete a value a newer Set wrote after it.
local done = redis.call('GET', KEYS[3])
if done then
  return done
end
-- A fence key of the wrong type is dropped (see acquire.lua).
local ft = redis.call('TYPE', KEYS[2]).ok
if ft ~= 'hash' and ft ~= 'none' then
  redis.call('DEL', KEYS[2])
end
-- The fence is max(counter + 1, the server's clock in µs), as in ACQUIRE.
local t = redis.call('TIME')
local n = math.max((tonumber(redis.call('HGET', KEYS[2], 'n')) or 0) + 1, t[1] * 1000000 + t[2])
redis.call('HSET', KEYS[2], 'n', string.format('%d', n))
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[1]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
end
redis.call('DEL', KEYS[1])
local fence = string.format('%d', n)
if ARGV[3] and ARGV[3] ~= '' then
  redis.call('PUBLISH', ARGV[3], ARGV[4] .. fence)
end
redis.call('SET', KEYS[3], fence, 'PX', ARGV[2])
return fence
