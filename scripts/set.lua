-- SET: store a value written by Cache.Set, advancing the fence first so
-- that every rebuild in flight is fenced, and wake the waiters.
-- KEYS[1] value, KEYS[2] fence hash, KEYS[3] this write's marker
-- ARGV[1] envelope (its fence bytes are stamped here), ARGV[2] value ttl ms,
-- ARGV[3] fence ttl ms, ARGV[4] PUBLISH or SPUBLISH, ARGV[5] channel,
-- ARGV[6] largest envelope sent inline in the message, ARGV[7] marker ttl ms,
-- optional ARGV[8] the near-cache channel ('' or absent: none) and ARGV[9]
-- the key's hash tag T
-- Returns the new fence (a decimal string).
-- The write also PUBLISHes T and the new fence on the near-cache channel
-- (classic PUBLISH, even on a Cluster): every process drops its near copy.
--
-- The marker makes a retry a no-op: go-redis sends a script again when the
-- reply was lost, and by then a newer Set may have landed, which a second
-- run would overwrite.
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
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
-- Stamp the fence, big-endian, into bytes 3..10 (exact below 2^53).
local f, be = n, ''
for _ = 1, 8 do
  be = string.char(f % 256) .. be
  f = math.floor(f / 256)
end
local env = string.sub(ARGV[1], 1, 2) .. be .. string.sub(ARGV[1], 11)
redis.call('SET', KEYS[1], env, 'PX', ARGV[2])
if #env <= tonumber(ARGV[6]) then
  redis.call(ARGV[4], ARGV[5], 'V' .. env)
else
  redis.call(ARGV[4], ARGV[5], 'W')
end
local fence = string.format('%d', n)
if ARGV[8] and ARGV[8] ~= '' then
  redis.call('PUBLISH', ARGV[8], ARGV[9] .. fence)
end
redis.call('SET', KEYS[3], fence, 'PX', ARGV[7])
return fence
