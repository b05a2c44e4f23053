-- COMMIT: write the leader's value only if its fence is still the current
-- one (no newer lease, no Invalidate, no Set since it acquired), wake the
-- waiters and release the lease, in one round trip.
-- KEYS[1] value, KEYS[2] lease, KEYS[3] fence hash, KEYS[4] refresh backoff
-- ARGV[1] fence token, ARGV[2] envelope, ARGV[3] value ttl ms,
-- ARGV[4] lease value, ARGV[5] PUBLISH or SPUBLISH, ARGV[6] channel,
-- ARGV[7] message when written, ARGV[8] message when fenced,
-- optional ARGV[9] the near-cache channel ('' or absent: none) and
-- ARGV[10] the key's hash tag T
-- Returns 1 when written, 0 when fenced (nothing written).
-- A write also PUBLISHes (classic PUBLISH, even on a Cluster) T and the
-- fence on the near-cache channel: every process drops its near copy.
-- A script that fails half-way keeps what it already wrote, so every check
-- that can fail (the ttl, the types of the keys) comes before any write: an
-- error reply means nothing changed and the lease is still held.
local ttl = tonumber(ARGV[3])
if not ttl or ttl < 1 or ttl >= 2^53 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR herd commit: invalid value ttl ' .. tostring(ARGV[3]))
end
if ARGV[5] ~= 'PUBLISH' and ARGV[5] ~= 'SPUBLISH' then
  return redis.error_reply('ERR herd commit: invalid publish command ' .. tostring(ARGV[5]))
end
local mine = redis.call('GET', KEYS[2]) == ARGV[4]
local current = redis.call('HGET', KEYS[3], 'n') == ARGV[1]
if mine then
  redis.call('DEL', KEYS[2])
  if redis.call('EXISTS', KEYS[3]) == 1 then
    redis.call('HSET', KEYS[3], 'r', ARGV[4])
  end
end
if not current then
  if mine then
    -- Our waiters must not wait for a value that will not come.
    redis.call(ARGV[5], ARGV[6], ARGV[8])
  end
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
-- A successful rebuild ends any refresh backoff.
redis.call('DEL', KEYS[4])
redis.call('HDEL', KEYS[3], 'e')
redis.call(ARGV[5], ARGV[6], ARGV[7])
if ARGV[9] and ARGV[9] ~= '' then
  redis.call('PUBLISH', ARGV[9], ARGV[10] .. ARGV[1])
end
return 1
