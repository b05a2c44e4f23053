// Package zookeeper is herd's lock in ZooKeeper.
package zookeeper
