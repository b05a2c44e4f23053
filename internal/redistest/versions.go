package redistest

// commandsSince70 are the commands Redis 7.0.0 added, as the Redis command
// reference lists them ("Available since: 7.0.0"). New subcommands of
// older commands (CLUSTER SHARDS, CLIENT NO-EVICT, PUBSUB SHARDNUMSUB,
// COMMAND DOCS, ...) and new options of older commands (EXPIRE NX, ...)
// cannot be renamed away, so they are not in the list.
var commandsSince70 = []string{
	"SPUBLISH", "SSUBSCRIBE", "SUNSUBSCRIBE",
	"EXPIRETIME", "PEXPIRETIME",
	"SINTERCARD", "ZINTERCARD", "LMPOP", "BLMPOP", "ZMPOP", "BZMPOP",
	"LCS", "SORT_RO",
	"EVAL_RO", "EVALSHA_RO", "FUNCTION", "FCALL", "FCALL_RO",
}

// Without70Commands returns redis-server options, for [Start] and
// [StartCluster], that remove every command Redis 7.0 added
// (rename-command to ""): a redis-server 7 then answers them, as 6.2
// does, with an unknown-command error, and COMMAND INFO reports them as
// nil. It is a partial emulation of Redis 6.2: the commands that remain
// behave as 7.0's do, including their 7.0 options and the 7.0 format of
// a script's error replies.
func Without70Commands() []string {
	opts := make([]string, 0, 3*len(commandsSince70))
	for _, c := range commandsSince70 {
		opts = append(opts, "--rename-command", c, "")
	}
	return opts
}
