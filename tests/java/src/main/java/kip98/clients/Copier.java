package kip98.clients;

import static kip98.clients.Json.obj;

import java.time.Duration;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.OutOfOrderSequenceException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.UnsupportedVersionException;
import org.apache.kafka.common.errors.WakeupException;

/** An exactly-once copier, the consume-transform-produce loop of Kafka's documentation:
 * {@code Copier BOOTSTRAP GROUP IN OUT TXID}.
 *
 * <p>A KIP-848 consumer ({@code group.protocol=consumer}, read_committed, no auto-commit) and
 * a transactional producer: each poll's records go to the same partition of {@code OUT} in
 * one transaction with the poll's next offsets ({@code sendOffsetsToTransaction} with the
 * consumer's group metadata), then commit; on a failure the transaction is aborted and the
 * consumer rewound to its group's committed offsets. A fatal error (fenced, unsupported)
 * ends the program with exit code 1. SIGTERM stops it between transactions.
 *
 * <p>It prints one JSON line per step, which the test counts: {@code init} after
 * initTransactions, {@code commit} (records copied) or {@code abort} (the error) after each
 * transaction, each with the producer epoch the Admin's describeTransactions gives then (a
 * probe of the test, not of the loop: on transaction version 2 it moves at every end).
 */
public final class Copier {
    private Copier() {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String group = args[1];
        String in = args[2];
        String out = args[3];
        String txid = args[4];
        Properties config = Common.consumerConfig(bootstrap, group, true);
        config.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
        // Small polls: many transactions, so a kill lands in the middle of the copying.
        config.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "20");
        KafkaConsumer<String, String> consumer = new KafkaConsumer<>(config);
        KafkaProducer<String, String> producer = Common.producer(bootstrap, txid);
        Admin admin = Common.admin(bootstrap);
        AtomicBoolean stopping = new AtomicBoolean(false);
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stopping.set(true);
            consumer.wakeup();
            try {
                main.join(Common.GUARD.toMillis());
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }));
        int status = 0;
        try {
            producer.initTransactions();
            report(admin, txid, "init", 0, null);
            consumer.subscribe(List.of(in));
            while (!stopping.get()) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                if (records.isEmpty()) {
                    continue;
                }
                try {
                    producer.beginTransaction();
                    for (ConsumerRecord<String, String> r : records) {
                        producer.send(new ProducerRecord<>(out, r.partition(), r.key(), r.value()));
                    }
                    producer.sendOffsetsToTransaction(records.nextOffsets(), consumer.groupMetadata());
                    producer.commitTransaction();
                    report(admin, txid, "commit", records.count(), null);
                } catch (ProducerFencedException | OutOfOrderSequenceException | AuthorizationException
                         | UnsupportedVersionException e) {
                    report(admin, txid, "fatal", 0, Common.error(e));
                    status = 1;
                    break;
                } catch (KafkaException e) {
                    producer.abortTransaction();
                    rewind(consumer);
                    report(admin, txid, "abort", records.count(), Common.error(e));
                }
            }
        } catch (WakeupException e) {
            // SIGTERM: stop between transactions.
        } finally {
            consumer.close();
            producer.close();
            admin.close();
        }
        if (status != 0) {
            Runtime.getRuntime().halt(status);  // not exit: the shutdown hook would wait for main
        }
    }

    /** Back to the group's committed offsets (the start of a partition that has none), so
     * the aborted transaction's records are read and copied again. */
    static void rewind(KafkaConsumer<String, String> consumer) {
        Set<TopicPartition> assigned = consumer.assignment();
        Map<TopicPartition, OffsetAndMetadata> committed = consumer.committed(assigned);
        for (TopicPartition tp : assigned) {
            OffsetAndMetadata at = committed.get(tp);
            if (at == null) {
                consumer.seekToBeginning(Collections.singleton(tp));
            } else {
                consumer.seek(tp, at.offset());
            }
        }
    }

    static void report(Admin admin, String txid, String step, int records, String error) throws Exception {
        int epoch = admin.describeTransactions(List.of(txid)).description(txid).get().producerEpoch();
        Common.emit(obj("step", step, "records", records, "epoch", epoch, "error", error));
    }
}
