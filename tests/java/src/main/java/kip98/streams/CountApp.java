package kip98.streams;

import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.kstream.TimeWindows;

/**
 * A stateful Kafka Streams application under exactly_once_v2, run until killed.
 *
 * <p>Input records carry their word in the value; the application re-keys them by it (a
 * repartition topic, "rekeyed"), counts each word ("counts", a compacted changelog) and
 * counts each word per 10-second window of record time ("windows", a windowed store). With
 * the record cache off, every count update goes to the output topics, so a read_committed
 * reader sees each word's counts 1, 2, ..., n once each and in order however often an
 * instance dies. Arguments: bootstrap, application id, input topic, counts topic, windows
 * topic, state directory.
 */
public final class CountApp {
    private CountApp() {}

    public static Properties config(String bootstrap, String applicationId, String stateDir) {
        Properties p = new Properties();
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG, 1);
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        p.put(StreamsConfig.REPARTITION_PURGE_INTERVAL_MS_CONFIG, 500);
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        // A killed member leaves the group after a short session, not the default 45 s.
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 6000);
        p.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 1000);
        return p;
    }

    public static StreamsBuilder topology(String input, String counts, String windows) {
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, String> words = builder
            .stream(input, Consumed.with(Serdes.String(), Serdes.String()))
            .selectKey((key, value) -> value)
            .repartition(Repartitioned.as("rekeyed"));
        words.groupByKey()
            .count(Materialized.as("counts"))
            .toStream()
            .mapValues(Object::toString)
            .to(counts, Produced.with(Serdes.String(), Serdes.String()));
        words.groupByKey()
            .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofSeconds(10), Duration.ofDays(1)))
            .count(Materialized.as("windows"))
            .toStream()
            .map((window, count) -> KeyValue.pair(
                window.key() + "@" + window.window().start(), count.toString()))
            .to(windows, Produced.with(Serdes.String(), Serdes.String()));
        return builder;
    }

    public static void main(String[] args) throws InterruptedException {
        Properties config = config(args[0], args[1], args[5]);
        StreamsBuilder builder = topology(args[2], args[3], args[4]);
        KafkaStreams streams = new KafkaStreams(builder.build(config), config);
        CountDownLatch stopped = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            System.out.println("{\"state\": \"" + now + "\"}");
            System.out.flush();
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                stopped.countDown();
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> streams.close(Duration.ofSeconds(20))));
        streams.start();
        stopped.await();
        System.exit(streams.state() == KafkaStreams.State.ERROR ? 2 : 0);
    }
}
