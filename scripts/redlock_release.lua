-- REDLOCK RELEASE (on one master): delete the lease only if it is still
-- this owner's here, and remember that it did (field q of the fence hash),
-- so that a retried release whose first reply was lost still says 1.
-- KEYS[1] lease, KEYS[2] fence hash, KEYS[3] this owner's released marker
-- ARGV[1] owner, ARGV[2] marker ms (0: none), ARGV[3] PUBLISH or SPUBLISH,
-- ARGV[4] the key's wake-up channel
-- When it deletes the lease and ARGV[3] is not empty, it publishes "R" on
-- the channel, so that the waiters of every process look again at once:
-- the release of a holder, and the release of a failed attempt's partial
-- grants, which may be what kept another attempt from its quorum (the
-- caller leaves ARGV[3] empty when another owner held a quorum: then
-- nobody could have won, and a wake-up would only start another round).
-- With ARGV[2] > 0 (the release of a failed attempt, sent to a master
-- whose round-one reply did not come), it also sets KEYS[3] for that
-- long, whatever the lease's state: a round-one request of this owner
-- that lands after the release then takes nothing.
-- Returns 1 when released (now or by an earlier try), 0 when not ours.
if tonumber(ARGV[2]) > 0 then
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if redis.call('EXISTS', KEYS[2]) == 1 then
    redis.call('HSET', KEYS[2], 'q', ARGV[1])
  end
  if ARGV[3] ~= '' then
    redis.call(ARGV[3], ARGV[4], 'R')
  end
  return 1
end
if redis.call('HGET', KEYS[2], 'q') == ARGV[1] then
  return 1
end
return 0
