-- ACQUIRE: take the lease if it is free and issue a fencing token.
-- KEYS[1] lease, KEYS[2] fence hash; for the Cache also KEYS[3] value,
-- KEYS[4] refresh backoff marker and KEYS[5] failure marker
-- ARGV[1] owner (random, 32 hex), ARGV[2] lease ms, ARGV[3] fence ttl ms,
-- ARGV[4] mode: absent (a plain lease), 'miss' or 'refresh',
-- ARGV[5] (refresh) the fence bytes of the envelope the caller saw,
-- ARGV[6] (miss) the fence of the leader the caller waits for, or '',
-- ARGV[7] (miss) after a retry, the fence of the leader whose failure was
-- retried, or '' (optional)
-- Returns:
--   {1, fence}        this owner holds the lease (fence: a decimal string)
--   {2, value}        nothing to rebuild: a value landed since the caller
--                     looked (miss: any value; refresh: a different envelope)
--   {3, pttl}         refresh: failed refreshes are backing off for pttl ms
--   {4, message}      miss: the awaited leader failed (its failure message),
--                     or, after a retry and with the lease free, a leader
--                     newer than the retried one failed (the retry failed)
--   {0, pttl, fence, counter}  another owner holds the lease for pttl ms;
--                     fence is the holder's, counter the key's fence counter
--                     now (a value announced later with a lower fence is
--                     older than a write the caller may have seen)
-- Keys of the wrong type (foreign writes, corruption) would fail every
-- call on this key until they expire: they are herd's own, so they are
-- dropped and rebuilt. A dropped fence is seeded again from the clock.
local lt = redis.call('TYPE', KEYS[1]).ok
if lt ~= 'string' and lt ~= 'none' then
  redis.call('DEL', KEYS[1])
end
local ft = redis.call('TYPE', KEYS[2]).ok
if ft ~= 'hash' and ft ~= 'none' then
  redis.call('DEL', KEYS[2])
end
local cur = redis.call('GET', KEYS[1])
if cur then
  local mine = ARGV[1] .. ':'
  if string.sub(cur, 1, #mine) == mine then
    -- A retry of an acquire that already ran (its reply was lost): the lease
    -- is ours, with the fence we were given then.
    return {1, string.sub(cur, #mine + 1)}
  end
end
local mode = ARGV[4]
if mode == 'miss' or mode == 'refresh' then
  -- pcall: a foreign value of another type is not ours to report.
  local v = redis.pcall('GET', KEYS[3])
  if type(v) == 'string' and (mode == 'miss' or string.sub(v, 3, 10) ~= ARGV[5]) then
    return {2, v}
  end
end
if mode == 'refresh' and redis.call('EXISTS', KEYS[4]) == 1 then
  return {3, redis.call('PTTL', KEYS[4])}
end
local holder = ''
if cur then
  holder = string.sub(cur, (string.find(cur, ':', 1, true) or #cur) + 1)
end
local awaited = ARGV[6] or ''
local after = ARGV[7] or ''
local gone = awaited ~= '' and holder ~= awaited
if mode == 'miss' and KEYS[5] and (gone or after ~= '') then
  -- The leader this caller waits for is gone: did it fail? (A follower
  -- whose subscription missed the failure message learns it here.) With
  -- the lease free, a newer leader's failure tells too (the marker holds
  -- only the last one): that leader was a retry or a takeover, and the
  -- caller must not call a failing source once more. After a retry
  -- (after: the retried leader's fence), only a newer leader's failure.
  local x = redis.call('GET', KEYS[5])
  local i = x and string.find(x, '|', 1, true)
  if i then
    local xf = string.sub(x, 1, i - 1)
    local floor = after
    if floor == '' then
      floor = awaited
    end
    if (after == '' and gone and xf == awaited) or (not cur and (tonumber(xf) or 0) > (tonumber(floor) or 0)) then
      return {4, string.sub(x, i + 1)}
    end
  end
end
if cur then
  return {0, redis.call('PTTL', KEYS[1]), holder, redis.call('HGET', KEYS[2], 'n') or ''}
end
-- The token is max(counter + 1, the server's clock in microseconds): it
-- never goes backwards when the counter expired, Redis restarted empty, or
-- a failover promoted a replica that missed the last tokens (exact below
-- 2^53 µs, the year 2255).
local t = redis.call('TIME')
local fence = string.format('%d', math.max((tonumber(redis.call('HGET', KEYS[2], 'n')) or 0) + 1, t[1] * 1000000 + t[2]))
redis.call('HSET', KEYS[2], 'n', fence)
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. fence, 'PX', ARGV[2])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return {1, fence}
