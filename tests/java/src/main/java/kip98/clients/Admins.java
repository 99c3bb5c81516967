package kip98.clients;

import static kip98.clients.Common.GUARD;
import static kip98.clients.Common.outcome;
import static kip98.clients.Common.readAll;
import static kip98.clients.Common.send;
import static kip98.clients.Json.obj;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.AbortTransactionSpec;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.DescribeProducersResult.PartitionProducerState;
import org.apache.kafka.clients.admin.FeatureMetadata;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListTransactionsOptions;
import org.apache.kafka.clients.admin.MemberToRemove;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.RemoveMembersFromConsumerGroupOptions;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.admin.TransactionState;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;

/** Kafka's Admin client: {@code Admins BOOTSTRAP SCENARIO ARGS...}.
 *
 * <ul>
 * <li>{@code topics TOPIC}: createTopics with configs, describeTopics, describeConfigs,
 *     incrementalAlterConfigs, createPartitions, describeCluster; describeFeatures apart.
 * <li>{@code transactions TOPIC TXID}: listOffsets by isolation, describeProducers,
 *     describeTransactions, listTransactions and its filters, deleteRecords,
 *     abortTransaction (KIP-664, WriteTxnMarkers) of an open transaction and what its
 *     producer meets afterwards, fenceProducers (KIP-618).
 * <li>{@code groups TOPIC GROUP}: listConsumerGroupOffsets, alterConsumerGroupOffsets,
 *     deleteConsumerGroupOffsets and removeMembersFromConsumerGroup, with a member and
 *     without.
 * </ul>
 */
public final class Admins {
    private Admins() {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        Map<String, Object> result;
        try (Admin admin = Common.admin(bootstrap)) {
            result = switch (args[1]) {
                case "topics" -> topics(admin, args[2]);
                case "transactions" -> transactions(admin, bootstrap, args[2], args[3]);
                case "groups" -> groups(admin, bootstrap, args[2], args[3]);
                default -> throw new IllegalArgumentException("unknown scenario " + args[1]);
            };
        }
        Common.emit(result);
    }

    static Map<String, Object> topics(Admin admin, String topic) throws Exception {
        NewTopic asked = new NewTopic(topic, 2, (short) 1)
            .configs(Map.of("retention.ms", "3600000", "cleanup.policy", "delete"));
        String created = outcome(() -> admin.createTopics(List.of(asked)).all().get());
        String again = outcome(() -> admin.createTopics(List.of(asked)).all().get());
        if ("ok".equals(created)) {
            awaitPartitions(admin, topic, 2);
        }
        ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        Object configsBefore = configs(admin, resource);
        String altered = outcome(() -> admin.incrementalAlterConfigs(Map.of(resource, List.of(
            new AlterConfigOp(new ConfigEntry("retention.ms", "7200000"), AlterConfigOp.OpType.SET),
            new AlterConfigOp(new ConfigEntry("cleanup.policy", null), AlterConfigOp.OpType.DELETE),
            new AlterConfigOp(new ConfigEntry("max.message.bytes", "100000"), AlterConfigOp.OpType.SET))))
            .all().get());
        String unknownConfig = outcome(() -> admin.incrementalAlterConfigs(Map.of(resource, List.of(
            new AlterConfigOp(new ConfigEntry("no.such.config", "1"), AlterConfigOp.OpType.SET))))
            .all().get());
        if ("ok".equals(altered)) {
            awaitConfig(admin, resource, "retention.ms", "7200000");
        }
        Object configsAfter = configs(admin, resource);
        Object partitionsBefore = partitions(admin, topic);
        String grown = outcome(() -> admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(3))).all().get());
        if ("ok".equals(grown)) {
            awaitPartitions(admin, topic, 3);
        }
        String shrunk = outcome(() -> admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(2))).all().get());
        String missing = outcome(() -> admin.describeTopics(List.of(topic + "-missing")).allTopicNames().get());
        DescribeClusterResult cluster = admin.describeCluster();
        FeatureMetadata features = admin.describeFeatures().featureMetadata().get();
        return obj(
            "create", created,
            "create_again", again,
            "configs_created", configsBefore,
            "incremental_alter", altered,
            "incremental_alter_unknown", unknownConfig,
            "configs_altered", configsAfter,
            "partitions_created", partitionsBefore,
            "create_partitions_3", grown,
            "create_partitions_2", shrunk,
            "partitions_grown", partitions(admin, topic),
            "describe_missing_topic", missing,
            "cluster_nodes", cluster.nodes().get().size(),
            "cluster_has_controller", cluster.controller().get() != null,
            "cluster_has_id", cluster.clusterId().get() != null,
            "features", obj(
                "finalized", new TreeSet<>(features.finalizedFeatures().keySet()),
                "supported", new TreeSet<>(features.supportedFeatures().keySet())));
    }

    /** Until the topic is described with ``count`` partitions: a broker may answer a
     * change before its metadata shows it (Apache Kafka publishes the controller's
     * metadata to its brokers asynchronously). */
    static void awaitPartitions(Admin admin, String topic, int count) throws InterruptedException {
        Common.waitUntil(topic + " with " + count + " partitions", () -> {
            try {
                return admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic)
                    .partitions().size() == count;
            } catch (Exception e) {
                return false;
            }
        });
    }

    /** Until the resource's config ``name`` is described as ``value`` (as above). */
    static void awaitConfig(Admin admin, ConfigResource resource, String name, String value)
            throws InterruptedException {
        Common.waitUntil(resource.name() + " with " + name + "=" + value, () -> {
            try {
                ConfigEntry e = admin.describeConfigs(List.of(resource)).all().get().get(resource).get(name);
                return e != null && value.equals(e.value());
            } catch (Exception e) {
                return false;
            }
        });
    }

    static Object configs(Admin admin, ConfigResource resource) throws Exception {
        Config config = admin.describeConfigs(List.of(resource)).all().get().get(resource);
        Map<String, Object> out = new TreeMap<>();
        for (String name : List.of("retention.ms", "cleanup.policy", "max.message.bytes")) {
            ConfigEntry e = config.get(name);
            out.put(name, e == null ? null : List.of(e.value(), e.source().name(), e.isDefault()));
        }
        return out;
    }

    static Object partitions(Admin admin, String topic) throws Exception {
        TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
        List<Object> out = new ArrayList<>();
        for (TopicPartitionInfo p : d.partitions()) {
            out.add(List.of(p.partition(), p.leader() != null, p.replicas().size(), p.isr().size()));
        }
        return obj("internal", d.isInternal(), "partitions", out);
    }

    static long offset(Admin admin, TopicPartition tp, OffsetSpec spec, IsolationLevel isolation) throws Exception {
        return admin.listOffsets(Map.of(tp, spec), new ListOffsetsOptions(isolation)).partitionResult(tp).get().offset();
    }

    static Object offsets(Admin admin, TopicPartition tp) throws Exception {
        return obj(
            "earliest", offset(admin, tp, OffsetSpec.earliest(), IsolationLevel.READ_UNCOMMITTED),
            "latest_read_uncommitted", offset(admin, tp, OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED),
            "latest_read_committed", offset(admin, tp, OffsetSpec.latest(), IsolationLevel.READ_COMMITTED));
    }

    static TransactionDescription describe(Admin admin, String txid) throws Exception {
        return admin.describeTransactions(List.of(txid)).description(txid).get();
    }

    static boolean listed(Admin admin, String txid, ListTransactionsOptions options) throws Exception {
        Collection<TransactionListing> all = admin.listTransactions(options).all().get();
        return all.stream().anyMatch(t -> t.transactionalId().equals(txid));
    }

    static Map<String, Object> transactions(Admin admin, String bootstrap, String topic, String txid) throws Exception {
        TopicPartition tp = new TopicPartition(topic, 0);
        Map<String, Object> result = new java.util.LinkedHashMap<>();
        try (KafkaProducer<String, String> plain = Common.producer(bootstrap, null);
             KafkaProducer<String, String> p = Common.producer(bootstrap, txid)) {
            send(plain, topic, "p0", "p1", "p2", "p3", "p4");
            p.initTransactions();
            p.beginTransaction();
            send(p, topic, "t0", "t1");
            result.put("offsets_open", offsets(admin, tp));

            PartitionProducerState producers = admin.describeProducers(List.of(tp)).partitionResult(tp).get();
            List<ProducerState> open = producers.activeProducers().stream()
                .filter(s -> s.currentTransactionStartOffset().isPresent()).collect(Collectors.toList());
            result.put("producers", producers.activeProducers().size());
            result.put("open_transaction_starts", open.stream()
                .map(s -> s.currentTransactionStartOffset().getAsLong()).collect(Collectors.toList()));
            ProducerState state = open.get(0);

            TransactionDescription d = describe(admin, txid);
            result.put("describe_open", obj(
                "state", d.state().name(),
                "partitions", d.topicPartitions().stream().map(TopicPartition::partition).sorted().collect(Collectors.toList()),
                "timeout_ms", d.transactionTimeoutMs(),
                "producer_id_matches", d.producerId() == state.producerId(),
                "started", d.transactionStartTimeMs().isPresent()));
            result.put("describe_unknown", outcome(() -> describe(admin, txid + "-unknown")));
            Thread.sleep(50);
            result.put("listed", obj(
                "all", listed(admin, txid, new ListTransactionsOptions()),
                "ongoing", listed(admin, txid, new ListTransactionsOptions().filterStates(List.of(TransactionState.ONGOING))),
                "complete_commit", listed(admin, txid, new ListTransactionsOptions().filterStates(List.of(TransactionState.COMPLETE_COMMIT))),
                "its_producer_id", listed(admin, txid, new ListTransactionsOptions().filterProducerIds(Set.of(state.producerId()))),
                "other_producer_id", listed(admin, txid, new ListTransactionsOptions().filterProducerIds(Set.of(state.producerId() + 1000))),
                "open_longer_than_0", listed(admin, txid, new ListTransactionsOptions().filterOnDuration(0)),
                "open_longer_than_1h", listed(admin, txid, new ListTransactionsOptions().filterOnDuration(3_600_000))));

            result.put("delete_records", admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(2)))
                .lowWatermarks().get(tp).get().lowWatermark());
            result.put("delete_records_beyond", outcome(() -> admin.deleteRecords(
                Map.of(tp, RecordsToDelete.beforeOffset(100))).all().get()));

            // KIP-664: the open transaction aborted on its partition by WriteTxnMarkers, with
            // the producer's epochs; a coordinator epoch not known there is taken as 0, as
            // kafka-transactions.sh takes it.
            AbortTransactionSpec spec = new AbortTransactionSpec(tp, state.producerId(),
                (short) state.producerEpoch(), Math.max(0, state.coordinatorEpoch().orElse(0)));
            result.put("abort", outcome(() -> admin.abortTransaction(spec).all().get()));
            result.put("offsets_aborted", offsets(admin, tp));
            result.put("read_committed_aborted", readAll(bootstrap, topic, true));
            result.put("abort_again", outcome(() -> admin.abortTransaction(spec).all().get()));
            AbortTransactionSpec stale = new AbortTransactionSpec(tp, state.producerId(),
                (short) (state.producerEpoch() - 1), 0);
            result.put("abort_stale_epoch", state.producerEpoch() > 0
                ? outcome(() -> admin.abortTransaction(stale).all().get()) : "InvalidProducerEpochException");
            TopicPartition missing = new TopicPartition(topic, 7);
            result.put("abort_missing_partition", outcome(() -> admin.abortTransaction(
                new AbortTransactionSpec(missing, state.producerId(), (short) state.producerEpoch(), 0))
                .all().get(10, java.util.concurrent.TimeUnit.SECONDS)));

            // The producer does not know: its coordinator still has the transaction open
            // and commits it; the records the marker aborted stay aborted.
            result.put("commit_after_abort", outcome(p::commitTransaction));
            p.beginTransaction();
            send(p, topic, "t2");
            p.commitTransaction();
            result.put("read_committed_values", readAll(bootstrap, topic, true).stream()
                .map(r -> r.get(1)).collect(Collectors.toList()));
        }

        // KIP-618: fenceProducers bumps the epoch of a transactional id (InitProducerId),
        // aborting its open transaction; the fenced instance's commit is refused.
        String fencedId = txid + "-fenced";
        TopicPartition fencedTp = new TopicPartition(topic, 0);
        try (KafkaProducer<String, String> f = Common.producer(bootstrap, fencedId)) {
            f.initTransactions();
            f.beginTransaction();
            send(f, topic, "f0");
            result.put("fence", outcome(() -> admin.fenceProducers(List.of(fencedId)).all().get()));
            result.put("fence_unknown_id", outcome(() -> admin.fenceProducers(List.of(fencedId + "-new")).all().get()));
            result.put("fenced_commit", outcome(f::commitTransaction));
            // Aborted, then Empty in the new epoch once the InitProducerId completes.
            Common.waitUntil("the fenced transaction aborted", () -> {
                try {
                    TransactionState s = describe(admin, fencedId).state();
                    return s == TransactionState.COMPLETE_ABORT || s == TransactionState.EMPTY;
                } catch (Exception e) {
                    throw new IllegalStateException(e);
                }
            });
            result.put("fenced_state", describe(admin, fencedId).state().name());
            long lso = offset(admin, fencedTp, OffsetSpec.latest(), IsolationLevel.READ_COMMITTED);
            long hw = offset(admin, fencedTp, OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED);
            result.put("fenced_lso_is_hw", lso == hw);
        }
        return result;
    }

    static Object groupOffsets(Admin admin, String group) throws Exception {
        Map<TopicPartition, OffsetAndMetadata> offsets =
            admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
        Map<String, Object> out = new TreeMap<>();
        offsets.forEach((tp, o) -> out.put("partition-" + tp.partition(), o == null ? null : List.of(o.offset(), o.metadata())));
        return out;
    }

    static Map<String, Object> groups(Admin admin, String bootstrap, String topic, String group) throws Exception {
        TopicPartition tp = new TopicPartition(topic, 0);
        try (KafkaProducer<String, String> p = Common.producer(bootstrap, null)) {
            send(p, topic, "g0", "g1", "g2", "g3");
        }
        Map<String, Object> result = new java.util.LinkedHashMap<>();
        String instance = group + "-static";
        java.util.Properties config = Common.consumerConfig(bootstrap, group, true);
        config.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, instance);
        KafkaConsumer<String, String> c = new KafkaConsumer<>(config);
        try {
            c.subscribe(List.of(topic));
            int seen = 0;
            long deadline = System.nanoTime() + GUARD.toNanos();
            while (seen < 4 && System.nanoTime() < deadline) {
                seen += c.poll(Duration.ofMillis(200)).count();
            }
            c.commitSync(Map.of(tp, new OffsetAndMetadata(2, "m")));
            result.put("offsets_committed", groupOffsets(admin, group));
            result.put("alter_with_member", outcome(() -> admin.alterConsumerGroupOffsets(
                group, Map.of(tp, new OffsetAndMetadata(3))).all().get()));
            result.put("delete_subscribed", outcome(() -> admin.deleteConsumerGroupOffsets(
                group, Set.of(tp)).all().get()));
            result.put("remove_unknown_member", outcome(() -> admin.removeMembersFromConsumerGroup(group,
                new RemoveMembersFromConsumerGroupOptions(List.of(new MemberToRemove(instance + "-other"))))
                .all().get()));
            result.put("remove_member", outcome(() -> admin.removeMembersFromConsumerGroup(group,
                new RemoveMembersFromConsumerGroupOptions(List.of(new MemberToRemove(instance)))).all().get()));
            Common.waitUntil("the group empty", () -> {
                try {
                    return admin.describeConsumerGroups(List.of(group)).describedGroups().get(group).get()
                        .members().isEmpty();
                } catch (Exception e) {
                    throw new IllegalStateException(e);
                }
            });
            result.put("alter_empty", outcome(() -> admin.alterConsumerGroupOffsets(
                group, Map.of(tp, new OffsetAndMetadata(3, "n"))).all().get()));
            result.put("offsets_altered", groupOffsets(admin, group));
            result.put("delete_empty", outcome(() -> admin.deleteConsumerGroupOffsets(group, Set.of(tp)).all().get()));
            result.put("offsets_deleted", groupOffsets(admin, group));
            result.put("list_unknown_group", groupOffsets(admin, group + "-none"));
        } finally {
            c.close(Duration.ZERO);
        }
        return result;
    }
}
