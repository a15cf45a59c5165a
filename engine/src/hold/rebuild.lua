-- Sets a missing day (key 1) or month (key 2) counter: the tokens billed before the
-- cutoff `ARGV[3]` (ms, Postgres' clock) as Postgres summed them (`ARGV[1]`/`ARGV[2]`),
-- plus the ledger's turns billed since the cutoff and within the
-- period (`ARGV[4]`/`ARGV[5]`: from when). The cutoff is kept as the counter's `since`
-- (keys 3 and 4): turns settling later add to it only if billed at or after it. Keys 5
-- and 6 are the ledger. `ARGV[6]`: the counters' lifetime (s). Set with `NX`: a counter
-- another replica rebuilt meanwhile stays.
for i = 1, 2 do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    local total = tonumber(ARGV[i])
    for _, turn in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], ARGV[3 + i], '+inf')) do
      total = total + tonumber(redis.call('HGET', KEYS[6], turn) or '0')
    end
    redis.call('SET', KEYS[i], string.format('%.0f', total), 'EX', ARGV[6])
    redis.call('SET', KEYS[i + 2], ARGV[3], 'EX', ARGV[6])
  end
end
return 1
