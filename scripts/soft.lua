-- SOFT INVALIDATE: advance the fence, as INVALIDATE does, and replace the
-- value with the client's rewrite of it (the same payload, marked stale),
-- but only if the value is still the one the client read: a
-- compare-and-swap. The envelope's checksum covers its times, which the
-- client rewrites; this script only stamps the new fence (outside the
-- checksum), as SET does.
-- KEYS[1] value, KEYS[2] fence hash, KEYS[3] this write's marker
-- ARGV[1] the first 42 bytes (the envelope header) of the value the client
-- read, ARGV[2] its length in bytes, or -1 when it read none,
-- ARGV[3] the new envelope, or '' to delete the value (no value to keep
-- serving: a plain invalidation), ARGV[4] fence ttl ms, ARGV[5] marker ttl ms,
-- optional ARGV[6] the near-cache channel ('' or absent: none) and ARGV[7]
-- the key's hash tag T
-- Returns {1, fence} when done (fence: a decimal string); {0, value} or
-- {0} (none there) when the value is not the one the client read: nothing
-- was written, and the client tries again with what is there now.
--
-- The header identifies a write: it holds the writer's fence, unique to
-- each write of the key, and the checksum of the rest. The value keeps the
-- time to live it had: a soft invalidation never makes a value live longer
-- (a tag's index covers the value only until its expiry, see tags.go).
-- The marker makes a retry a no-op (see set.lua). A write also PUBLISHes
-- T and the new fence on the near-cache channel, as SET does.
local done = redis.call('GET', KEYS[3])
if done then
  return {1, done}
end
local want = tonumber(ARGV[2])
if not want then
  return redis.error_reply('ERR herd soft invalidate: invalid length ' .. tostring(ARGV[2]))
end
-- pcall: a foreign value of another type is no value (INVALIDATE deletes it).
local cur = redis.pcall('GET', KEYS[1])
if type(cur) ~= 'string' then
  cur = nil
end
if cur == nil then
  if want >= 0 then
    return {0}
  end
elseif #cur ~= want or string.sub(cur, 1, 42) ~= ARGV[1] then
  return {0, cur}
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
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[4]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
if ARGV[3] == '' or cur == nil then
  redis.call('DEL', KEYS[1])
else
  -- Stamp the fence, big-endian, into bytes 3..10 (exact below 2^53).
  local f, be = n, ''
  for _ = 1, 8 do
    be = string.char(f % 256) .. be
    f = math.floor(f / 256)
  end
  local env = string.sub(ARGV[3], 1, 2) .. be .. string.sub(ARGV[3], 11)
  local left = redis.call('PTTL', KEYS[1])
  if left == -1 then
    redis.call('SET', KEYS[1], env) -- it had no expiry (not herd's writing)
  else
    redis.call('SET', KEYS[1], env, 'PX', math.max(left, 1))
  end
end
local fence = string.format('%d', n)
if ARGV[6] and ARGV[6] ~= '' then
  redis.call('PUBLISH', ARGV[6], ARGV[7] .. fence)
end
redis.call('SET', KEYS[3], fence, 'PX', ARGV[5])
return {1, fence}
